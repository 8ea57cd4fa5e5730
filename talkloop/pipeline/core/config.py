"""The root configuration: one pydantic model, nested per concern, validated at construction.

Validation messages quote the offending values and say what to change.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.spec import DEFAULT_FAMILY, get_spec
from talkloop.pipeline.offload.device import driver_available
from talkloop.pipeline.offload.distributed import env_world_size


@functools.cache
def cpu_info() -> dict[str, str]:
    """This machine's first CPU as ``/proc/cpuinfo`` describes it, field -> value (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block ends here
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return info


def _cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this machine's CPU (``/proc/cpuinfo``; empty elsewhere)."""
    return frozenset(cpu_info().get("flags", "").split())


def native_bf16(device: str) -> bool:
    """Whether ``device`` computes bf16 in hardware: CUDA, or a CPU with AVX512-BF16 or AMX.

    Elsewhere PyTorch emulates bf16 and it is several times slower than float32
    (docs/benchmarks.md, "Figures behind code choices").
    """
    return device == "cuda" or bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VideoConfig(_Strict):
    width: int = Field(256, description="output width in pixels")
    height: int = Field(256, description="output height in pixels")
    fps: int = Field(25, ge=1, le=60, description="frames per second")

    def check_size(self, family: str) -> None:
        """Raise ValueError unless both sides suit ``family`` (its spec's size rule)."""
        rule = get_spec(family).size_rule
        for name, value in (("width", self.width), ("height", self.height)):
            problem = rule.check(value)
            if problem:
                raise ValueError(f"unsupported {name} {value} for the {family} family: {problem}")


class AudioConfig(_Strict):
    sample_rate: int = Field(16000, ge=8000, le=48000, description="pipeline audio rate (Hz)")


class ScheduleConfig(_Strict):
    """Chunk sizes of the N/I timeline, in frames (docs/architecture.md)."""

    first_len: int = Field(2, ge=1, le=256, description="length of N0 (short: first frame fast)")
    n_len: int = Field(24, ge=2, le=256, description="length of every later N chunk")
    i_len: int = Field(
        3, ge=0, le=64, description="frames at the start of N(k+1) an I chunk redoes"
    )
    ctx_len: int = Field(2, ge=1, le=16, description="motion-context latents carried to the next N")

    @model_validator(mode="after")
    def _check(self) -> ScheduleConfig:
        if self.i_len + 1 > self.n_len:
            raise ValueError(
                f"i_len={self.i_len} needs n_len >= i_len + 1 (the far anchor is frame i_len of the "
                f"next N chunk), but n_len={self.n_len}"
            )
        if self.ctx_len > min(self.first_len, self.n_len):
            raise ValueError(
                f"ctx_len={self.ctx_len} is longer than a chunk (first_len={self.first_len}, "
                f"n_len={self.n_len}); use ctx_len <= {min(self.first_len, self.n_len)}"
            )
        return self


class SamplerConfig(_Strict):
    # 3 steps: since the mouth net sets the mouth, a fourth step changes nothing measurable and
    # costs frame time (docs/benchmarks.md, "Figures behind code choices").
    steps: int = Field(3, ge=1, le=100, description="Euler steps of the A2V flow sampler")
    # With 2 steps the trained model's I frames were softer than the N frames around them, so the
    # change at their edges was larger; 3 steps smooth the seams, 4 add little
    # (docs/benchmarks.md, "Figures behind code choices").
    i_steps: int = Field(3, ge=1, le=100, description="Euler steps for I chunks")
    shift: float = Field(3.0, gt=0, le=20, description="timestep shift (SD3-style); 1 = none")
    audio_guidance: float = Field(1.0, ge=0, le=10, description="CFG scale on audio; 1 = off")


Placement = Literal["resident", "offloaded", "sharded"]


class PlacementConfig(_Strict):
    """Where each module's weights live (docs/offload.md).

    ``resident``: on the device. ``offloaded``: pinned host masters, copied block by block into a
    ring of device slots just before use. ``sharded``: FSDP2 shards across the ranks of a
    ``torchrun`` launch.
    """

    vae: Placement = "resident"
    audio_encoder: Placement = "resident"
    text_encoder: Placement = "resident"
    a2v: Placement = "resident"
    sr: Placement = "resident"


class ModelConfig(_Strict):
    family: str = Field(
        DEFAULT_FAMILY,
        description="the model family (talkloop/pipeline/models/spec.py lists the known ones)",
    )
    preset: Literal["default", "tiny", "large"] = Field("default", description="network sizes")
    weights: Path | None = Field(
        None, description="checkpoint folder; None = the weights installed with the package"
    )
    untrained: bool = Field(False, description="use random weights (tests, benchmarks)")
    # The CLI's default for both is auto. Built in code, a pipeline computes in float32 on torch
    # unless asked: auto times candidates on this machine (cached), and a test's result must not
    # depend on which CPU it runs on.
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "float32",
        description="compute dtype of the torch networks; auto: bfloat16 or float32, whichever "
        "runs the family's chunk faster here (timed once per machine and cached; float32 "
        "without timing where bf16 is emulated, bfloat16 on CUDA)",
    )
    backend: Literal["auto", "torch", "onnxruntime", "openvino"] = Field(
        "torch",
        description="what runs the family's hot networks: torch, or graphs exported from the "
        "same weights run by ONNX Runtime or OpenVINO (float32, decoder in int8); auto: the "
        "fastest on this machine, timed once and cached (docs/architecture.md, inference "
        "backends). A family whose spec lists only torch in its backends ignores it",
    )
    device: Literal["cpu", "cuda"] = Field("cpu", description="where the networks compute")
    render_processes: int | None = Field(
        None,
        ge=0,
        le=64,
        description="worker processes for the family's per-frame rendering (a family whose "
        "render stage takes them), shared by every session of the process; 0: each session "
        "renders on its own thread; None: one per core in live calls, 0 elsewhere "
        "(talkloop/pipeline/core/workers.py says why)",
    )
    placement: PlacementConfig = PlacementConfig()
    offload_slots: int = Field(
        2, ge=2, le=8, description="device slots per offloaded module (prefetch depth + 1)"
    )
    stage_prefetch_blocks: int = Field(
        1, ge=0, le=8, description="first blocks of the next stage's model loaded during a stage"
    )
    pin_memory: bool | None = Field(
        None, description="page-locked host masters; None = wherever a CUDA driver exists"
    )

    @field_validator("family")
    @classmethod
    def _known_family(cls, name: str) -> str:
        get_spec(name)  # ValueError naming the known families
        return name

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.untrained and self.weights is not None:
            raise ValueError("choose either weights=<folder> or untrained=true, not both")
        self._check_placement()
        if self.backend not in ("auto", "torch"):
            moved = [n for n, mode in self.placement.model_dump().items() if mode != "resident"]
            if self.device != "cpu" or moved:
                raise ValueError(
                    f"backend={self.backend!r} runs resident networks on the CPU, but "
                    + (
                        f"device={self.device!r}"
                        if self.device != "cpu"
                        else f"{moved} are not resident"
                    )
                    + "; use backend='torch' (or 'auto', which picks torch there)"
                )
        return self

    def _check_placement(self) -> None:

        # Only modules with transformer blocks (a ``.blocks`` ModuleList) can be offloaded or
        # sharded per block (load_modules checks the built networks again).
        with_blocks = get_spec(self.family).block_modules
        for name, mode in self.placement.model_dump().items():
            if mode != "resident" and name not in with_blocks:
                raise ValueError(
                    f"placement.{name}={mode!r}: {name} has no transformer blocks to "
                    f"{'offload' if mode == 'offloaded' else 'shard'} (only "
                    f"{', '.join(with_blocks)} do); set placement.{name}='resident'"
                )
            if mode == "sharded" and env_world_size() < 2:
                raise ValueError(
                    f"placement.{name}='sharded' needs more than one process, but the world "
                    "size is 1; launch with `torchrun --nproc-per-node 2 -m talkloop ...` "
                    f"or set placement.{name}='offloaded'"
                )
        needs_driver = self.device == "cuda" or self.pin_memory
        if needs_driver and not driver_available():
            what = "device='cuda'" if self.device == "cuda" else "pin_memory=true"
            raise ValueError(
                f"{what} needs a CUDA driver and GPU, and none was found; "
                "use device='cpu' and pin_memory=null (pinned only where a driver exists)"
            )
        if self.pin_memory and self.device == "cpu":
            raise ValueError(
                "pin_memory=true only helps copies to a GPU, but device='cpu'; "
                "set device='cuda' or pin_memory=null"
            )


class OutputConfig(_Strict):
    crf: int = Field(23, ge=0, le=51, description="H.264 quality (lower is better)")
    preset: str = Field("veryfast", description="x264 preset")


class TalkloopConfig(_Strict):
    video: VideoConfig = VideoConfig()
    audio: AudioConfig = AudioConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    sampler: SamplerConfig = SamplerConfig()
    model: ModelConfig = ModelConfig()
    output: OutputConfig = OutputConfig()
    seed: int = Field(0, ge=0, lt=2**63, description="noise seed")

    @model_validator(mode="before")
    @classmethod
    def _family_size(cls, data: object) -> object:
        """Without a frame size, the family's own (the first of its native sizes)."""
        if not isinstance(data, dict):
            return data
        model, video = data.get("model") or {}, data.get("video") or {}
        if not isinstance(video, dict) or "width" in video or "height" in video:
            return data
        name = model.get("family", DEFAULT_FAMILY) if isinstance(model, dict) else model.family
        try:
            width, height = get_spec(name).native_sizes[0]
        except ValueError:
            return data  # an unknown family: model.family's own error says so
        return {**data, "video": {**video, "width": width, "height": height}}

    @model_validator(mode="after")
    def _check_size(self) -> TalkloopConfig:
        self.video.check_size(self.model.family)
        return self


def build_config(**overrides: object) -> TalkloopConfig:
    """Build a config from nested dicts, turning validation failures into one ConfigError."""
    try:
        return TalkloopConfig.model_validate(overrides)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        parts.append(f"{where}: {msg}{shown}")
    return "invalid config: " + "; ".join(parts)
