"""TLS for `talkloop serve`: the server's SSL context, from given files or a self-signed pair.

Browsers only give a page the microphone on a secure origin (https, or http on localhost), so a
server that other machines reach needs TLS: ``--tls-cert``/``--tls-key`` (a certificate from a CA
the users' browsers trust), or ``--tls-self-signed`` (a certificate made here for the host names
and IPs given; browsers warn once, and an agent trusts it with the certificate file as its CA).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import ssl
from collections.abc import Sequence
from pathlib import Path

from talkloop.pipeline.core.errors import ConfigError

SELF_SIGNED_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=1)


def server_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """An SSL context serving ``cert`` (PEM, chain allowed) with its private ``key`` (PEM).

    Raises:
        ConfigError: a file is missing or unreadable, or the key does not match the certificate.
    """
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not Path(path).is_file():
            raise ConfigError(f"{flag}: no such file: {path}")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as err:
        raise ConfigError(
            f"--tls-cert/--tls-key: cannot use {cert} with {key}: {err.reason or err}"
        ) from None
    return ctx


def self_signed(names: Sequence[str], folder: str | Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for ``names`` (host names and IP addresses), in
    ``folder``; reused while it is valid for more than a day (so a browser's exception for it
    survives a restart).

    Returns:
        (certificate path, key path), both PEM; the key file is readable by its owner only.

    Raises:
        ConfigError: no names, or the folder cannot be written.
    """
    names = sorted({n.strip().lower() for n in names if n.strip()})
    if not names:
        raise ConfigError("--tls-self-signed needs at least one host name or IP address")
    digest = hashlib.sha256(",".join(names).encode()).hexdigest()[:12]
    folder = Path(folder).expanduser()
    cert_path, key_path = folder / f"self-signed-{digest}.pem", folder / f"self-signed-{digest}.key"
    if cert_path.is_file() and key_path.is_file() and _valid_for_a_while(cert_path):
        return cert_path, key_path
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"talkloop {names[0]}")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        # CA:TRUE so a client can trust this one certificate as its own root (cafile=...).
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        pem_key = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem_key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    except OSError as err:
        raise ConfigError(
            f"--tls-self-signed: cannot write the certificate to {folder}: {err.strerror or err}"
        ) from None
    return cert_path, key_path


def fingerprint(cert: str | Path) -> str:
    """SHA-256 fingerprint of a PEM certificate, as browsers show it (AB:CD:...)."""
    der = ssl.PEM_cert_to_DER_cert(Path(cert).read_text())
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def default_folder() -> Path:
    """Where self-signed pairs are kept: ``$XDG_CONFIG_HOME/talkloop/tls`` (or ~/.config)."""
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "talkloop" / "tls"


def _valid_for_a_while(cert_path: Path) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > RENEW_BEFORE
