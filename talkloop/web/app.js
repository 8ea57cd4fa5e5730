// talkloop web client: one websocket for signaling and control, one RTCPeerConnection for media.
"use strict";

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"), notice: $("notice"), video: $("avatar"), placeholder: $("placeholder"),
  overlay: $("overlay"), call: $("call"), mic: $("mic"), interrupt: $("interrupt"),
  say: $("say"), sayBtn: $("say-btn"), prompt: $("prompt"), promptBtn: $("prompt-btn"), log: $("log"),
};

// avatar: the chosen photo as base64 JPEG (sent first on the next call's websocket), or null.
// ending: why the server is about to close the call (shown instead of "Disconnected").
const call = { ws: null, pc: null, mic: null, token: null, open: false, avatar: null, ending: null };
// Exposed for automated tests (Playwright reads getStats through it).
window.talkloop = { call, stats: () => (call.pc ? call.pc.getStats() : null) };

function setStatus(text, kind = "") { ui.status.textContent = text; ui.status.className = "status " + kind; }
function log(text, isError = false) {
  const line = document.createElement("div");
  line.textContent = new Date().toLocaleTimeString() + "  " + text;
  if (isError) line.className = "err";
  ui.log.prepend(line);
  while (ui.log.childElementCount > 50) ui.log.lastChild.remove();
}
function send(msg) { if (call.ws && call.ws.readyState === WebSocket.OPEN) call.ws.send(JSON.stringify(msg)); }
function setInCall(inCall) {
  call.open = inCall;
  ui.call.textContent = inCall ? "End call" : "Start call";
  ui.call.classList.toggle("end", inCall);
  for (const el of [ui.interrupt, ui.sayBtn, ui.promptBtn]) el.disabled = !inCall;
  ui.mic.disabled = !inCall || !call.mic;
  ui.overlay.hidden = !inCall;
}

// The server's access token, if it needs one: asked once, kept for this tab (sessionStorage),
// sent as ?access= on the websocket (browsers cannot set headers there). null: none given.
const ACCESS_KEY = "talkloop.access";
async function accessToken() {
  const r = await fetch("/api/access", { cache: "no-store" });
  if (!r.ok || !(await r.json()).token_required) return "";
  let token = sessionStorage.getItem(ACCESS_KEY);
  if (!token) {
    token = (window.prompt("This talkloop server needs its access token:") || "").trim();
    if (!token) return null;
    sessionStorage.setItem(ACCESS_KEY, token);
  }
  return token;
}

async function startCall() {
  setStatus("Connecting…");
  ui.call.disabled = true;
  let access;
  try {
    access = await accessToken();
  } catch (err) {
    access = "";  // an older server without /api/access: no token
  }
  if (access === null) {
    ui.call.disabled = false;
    return setStatus("Access token needed", "error");
  }
  // The microphone before the session: the server closes a session whose offer does not come
  // within its offer timeout, and a permission prompt can stay open longer than that.
  try {
    call.mic = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, channelCount: 1 },
    });
  } catch (err) {
    call.mic = null;
    log("microphone unavailable: the avatar will still speak what you type", true);
  }
  const query = new URLSearchParams();
  if (call.avatar) query.set("avatar", "1");
  if (access) query.set("access", access);
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const qs = query.toString();
  const ws = new WebSocket(`${scheme}://${location.host}/ws${qs ? "?" + qs : ""}`);
  call.ws = ws;
  call.ending = null;
  call.token = null;
  let opened = false;
  ws.onopen = () => {
    opened = true;
    if (call.avatar) ws.send(JSON.stringify({ type: "avatar", image: call.avatar }));
  };
  ws.onmessage = (ev) => onMessage(JSON.parse(ev.data)).catch((e) => log(String(e), true));
  ws.onclose = (ev) => {
    if (call.ws !== ws) return;
    // Refused before the upgrade (another origin, too many connections): the browser says no more.
    if (!opened) return endCall("Connection refused by the server", "error");
    if (call.ending) return endCall(call.ending, "error");
    endCall(ev.reason ? `Disconnected: ${ev.reason}` : "Call ended");
  };
  ws.onerror = () => log("connection error", true);
}

async function onMessage(msg) {
  switch (msg.type) {
    case "session": return beginMedia(msg);
    case "answer": return call.pc.setRemoteDescription({ type: "answer", sdp: msg.sdp });
    case "stats": return showStats(msg);
    case "speech": return log(`avatar speech ${msg.state}`);
    case "error":
      log(`${msg.code}: ${msg.message}`, true);
      if (msg.code === "busy" && !call.token) setStatus("Server busy", "error");
      if (msg.code === "bad_token") setStatus("Server busy", "error");
      if (msg.code === "bad_avatar") setStatus("Photo refused", "error");
      if (msg.code === "bad_access") {
        sessionStorage.removeItem(ACCESS_KEY);  // ask again on the next try
        call.ending = "Access token refused";
      }
      if (msg.code === "generation_failed") call.ending = "The avatar stopped (generation failed)";
      if (msg.code === "offer_timeout") call.ending = "Timed out: the call did not start";
      if (call.ending) setStatus(call.ending, "error");
      return;
    default: log(`unknown message ${msg.type}`);
  }
}

// The server's ICE servers (STUN/TURN, `talkloop serve --ice-server`); `?relay=1` in the page's
// address sends the call through the TURN server only, as `--ice-relay-only` does for every page.
function iceConfiguration(ice) {
  const config = { iceServers: (ice && ice.iceServers) || [] };
  const relay = new URLSearchParams(location.search).get("relay") === "1";
  config.iceTransportPolicy = relay || (ice && ice.iceTransportPolicy === "relay") ? "relay" : "all";
  if (config.iceTransportPolicy === "relay" && !config.iceServers.some((s) => String(s.urls).startsWith("turn"))) {
    log("relay only, but the server names no TURN server: the call cannot connect", true);
  }
  return config;
}

async function beginMedia(session) {
  call.token = session.token;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  $("agent-url").textContent = `${scheme}://${location.host}/ws?token=${session.token}&role=agent`;
  $("agent").hidden = false;
  $("agent-access").hidden = !sessionStorage.getItem(ACCESS_KEY);
  if (session.notice) { ui.notice.textContent = session.notice; ui.notice.hidden = false; }
  if (session.prompt) ui.prompt.value = session.prompt;
  const pc = new RTCPeerConnection(iceConfiguration(session.ice));
  call.pc = pc;
  if (call.mic) {
    for (const track of call.mic.getAudioTracks()) pc.addTrack(track, call.mic);
  } else {
    pc.addTransceiver("audio", { direction: "recvonly" });
  }
  pc.addTransceiver("video", { direction: "recvonly" });
  const remote = new MediaStream();
  ui.video.srcObject = remote;
  pc.ontrack = (ev) => { remote.addTrack(ev.track); ui.placeholder.hidden = true; };
  pc.onicecandidate = (ev) => send({
    type: "candidate",
    candidate: ev.candidate ? ev.candidate.candidate : null,
    sdpMid: ev.candidate ? ev.candidate.sdpMid : null,
    sdpMLineIndex: ev.candidate ? ev.candidate.sdpMLineIndex : null,
  });
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "connected") setStatus("Live", "live");
    if (pc.connectionState === "failed") endCall("Connection failed");
  };
  await pc.setLocalDescription(await pc.createOffer());
  send({ type: "offer", sdp: pc.localDescription.sdp });
  setInCall(true);
  ui.call.disabled = false;
  setStatus("Starting…");
}

let lastDecoded = null;
async function showStats(s) {
  $("s-fps").textContent = s.fps ?? "–";
  $("s-rtf").textContent = s.rtf ?? "–";
  const rt = s.runtime;  // e.g. onnxruntime, float32, decoder in int8
  $("s-backend").textContent = rt ? `${rt.backend} ${rt.dtype}${rt.int8.length ? " + int8" : ""}` : "–";
  $("s-dropped").textContent = (s.dropped_frames ?? 0) + (s.late_frames ?? 0) + (s.overrun_frames ?? 0);
  let delay = s.playout_delay_ms;
  if (call.pc) {
    const report = await call.pc.getStats();
    report.forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "video" && r.jitterBufferEmittedCount) {
        delay += Math.round((1000 * r.jitterBufferDelay) / r.jitterBufferEmittedCount);
        lastDecoded = r.framesDecoded;
      }
    });
  }
  $("s-latency").textContent = delay ?? "–";
}

function endCall(reason = "Call ended", kind = "") {
  const { ws, pc, mic } = call;
  call.ws = call.pc = call.mic = null;
  if (ws && ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify({ type: "bye" })); ws.close(); }
  if (pc) pc.close();
  if (mic) mic.getTracks().forEach((t) => t.stop());
  ui.video.srcObject = null;
  $("agent").hidden = true;
  ui.placeholder.hidden = false;
  setInCall(false);
  ui.call.disabled = false;
  setStatus(reason, kind);
}

ui.call.onclick = () => (call.open ? endCall() : startCall());
ui.mic.onclick = () => {
  if (!call.mic) return;
  const track = call.mic.getAudioTracks()[0];
  track.enabled = !track.enabled;
  ui.mic.textContent = track.enabled ? "Mic on" : "Mic off";
  ui.mic.classList.toggle("off", !track.enabled);
};
ui.interrupt.onclick = () => send({ type: "interrupt" });
$("agent-copy").onclick = () => navigator.clipboard?.writeText($("agent-url").textContent);
$("say-form").onsubmit = (ev) => {
  ev.preventDefault();
  const text = ui.say.value.trim();
  if (!text) return;
  send({ type: "say", text });
  log(`say: ${text.slice(0, 60)}`);
  ui.say.value = "";
};
$("prompt-form").onsubmit = (ev) => {
  ev.preventDefault();
  send({ type: "prompt", text: ui.prompt.value });
  log(`prompt: ${ui.prompt.value || "(none)"}`);
};

// The avatar photo: checked here, re-encoded as a JPEG of at most AVATAR_SIDE px (EXIF rotation
// applied) so it fits one websocket message; the server checks it again and frames the face.
const AVATAR_TYPES = ["image/jpeg", "image/png", "image/webp"];
const AVATAR_MAX_FILE = 20 * 1024 * 1024;
const AVATAR_SIDE = 800;
const AVATAR_MAX_B64 = 235000; // the server takes 180 kB decoded
async function chooseAvatar(file) {
  if (!AVATAR_TYPES.includes(file.type)) {
    return log(`avatar: ${file.name} is not a JPEG, PNG or WebP photo`, true);
  }
  if (file.size > AVATAR_MAX_FILE) return log(`avatar: ${file.name} is larger than 20 MB`, true);
  let bitmap;
  try {
    bitmap = await createImageBitmap(file, { imageOrientation: "from-image" });
  } catch (err) {
    return log(`avatar: ${file.name} could not be read as an image`, true);
  }
  const scale = Math.min(1, AVATAR_SIDE / Math.max(bitmap.width, bitmap.height));
  const canvas = document.createElement("canvas");
  canvas.width = Math.round(bitmap.width * scale);
  canvas.height = Math.round(bitmap.height * scale);
  canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  let url = canvas.toDataURL("image/jpeg", 0.9);
  for (let q = 0.75; url.length > AVATAR_MAX_B64 && q > 0.3; q -= 0.15) {
    url = canvas.toDataURL("image/jpeg", q);
  }
  call.avatar = url.slice(url.indexOf(",") + 1);
  $("avatar-preview").src = url;
  $("avatar-pick").hidden = false;
  log(`avatar for the next call: ${file.name}`);
}
$("avatar-file").onchange = (ev) => {
  const file = ev.target.files[0];
  if (file) chooseAvatar(file).catch((e) => log(String(e), true));
};
$("avatar-clear").onclick = () => {
  call.avatar = null;
  $("avatar-file").value = "";
  $("avatar-pick").hidden = true;
  log("avatar for the next call: the server's own");
};
