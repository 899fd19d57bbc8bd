"""Ed25519 keys: generation, loading, the key id, and the set of keys a project trusts.

Private key material never appears in a message, an exception, or any file but the key file:
every error below says what is wrong with a key without quoting it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pytest_cudagate.boundary import walk
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import command, display_path

SIGNING_KEY_ENV = "CUDAGATE_SIGNING_KEY"
PASSPHRASE_ENV = "CUDAGATE_SIGNING_KEY_PASSPHRASE"
# Optional trust root outside the repository: a CI variable listing the key ids allowed to sign.
# When set, a .pub file a pull request adds under .cudagate/trusted_keys/ is not enough to be trusted.
TRUSTED_IDS_ENV = "CUDAGATE_TRUSTED_KEY_IDS"
TRUSTED_KEYS_DIR = Path(".cudagate") / "trusted_keys"
KEY_ID_HEX = 16
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def key_id(public_key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """Short fingerprint: the first 16 hex digits of SHA-256 over the raw 32-byte public key."""
    if isinstance(public_key, Ed25519PrivateKey):
        public_key = public_key.public_key()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:KEY_ID_HEX]


def find_project_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding pyproject.toml or .git."""
    start = Path(start).resolve()
    for folder in [start, *start.parents] if start.is_dir() else list(start.parents):
        if (folder / "pyproject.toml").is_file() or (folder / ".git").exists():
            return folder
    return None


def default_key_dir() -> Path:
    """Where ``cudagate keygen`` puts private keys: outside any repository, under the user's config."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "cudagate" / "keys"


# --------------------------------------------------------------------------- generation


@dataclass(frozen=True)
class GeneratedKey:
    key_id: str
    private_path: Path
    public_path: Path


def _write_exclusive(path: Path, data: bytes, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, mode)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)  # the umask may only have narrowed it; make it exact
        with os.fdopen(fd, "wb") as handle:
            fd = -1
            handle.write(data)
    finally:
        if fd >= 0:
            os.close(fd)


def generate_key_pair(name: str, *, private_path: Path, public_path: Path) -> GeneratedKey:
    """Write a new Ed25519 key pair: private key PEM (PKCS#8) mode 0600, public key PEM.

    Refuses to overwrite either file: replacing a private key loses the ability to sign as it, and
    replacing a trusted public key silently revokes everything the old key signed.
    """
    if not _NAME.match(name):
        raise CudagateError(f"key name {name!r}: use letters, digits, '.', '_' or '-' (it names {name}.pub)")
    private_path, public_path = Path(private_path), Path(public_path)
    for path, what in ((private_path, "private key"), (public_path, "public key")):
        if path.exists() or path.is_symlink():
            raise FileError(path, [f"a {what} file already exists; cudagate keygen never overwrites one",
                                   "fix: pick another --name (for rotation, e.g. NAME-2), or move the old file "
                                   "away yourself if you really mean to replace it"])
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    private_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    public_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _write_exclusive(private_path, pem, 0o600)
    except FileExistsError:
        raise FileError(private_path, ["a private key file already exists; cudagate keygen never overwrites one"]) from None
    except OSError as exc:
        raise FileError(private_path, [f"cannot write the private key: {exc.strerror}"]) from None
    try:
        _write_exclusive(public_path, public_pem, 0o644)
    except OSError as exc:
        private_path.unlink()  # no orphan private key without its public half
        raise FileError(public_path, [f"cannot write the public key: {exc.strerror}"]) from None
    return GeneratedKey(key_id(key), private_path, public_path)


# --------------------------------------------------------------------------- private keys


class _BadKey(Exception):
    """Internal: why key bytes were refused (a reason, never the bytes)."""


def _raw_private(raw: bytes) -> Ed25519PrivateKey:
    if len(raw) == 64:  # libsodium/NaCl layout: seed || public key
        key = Ed25519PrivateKey.from_private_bytes(raw[:32])
        if key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) != raw[32:]:
            raise _BadKey("holds 64 bytes whose second half is not the public key of the first")
        return key
    if len(raw) != 32:
        raise _BadKey(f"decodes to {len(raw)} bytes; a raw Ed25519 private key is 32 bytes")
    return Ed25519PrivateKey.from_private_bytes(raw)


def _decode_compact(text: str) -> bytes | None:
    text = "".join(text.split())
    if re.fullmatch(r"[0-9a-fA-F]{64}|[0-9a-fA-F]{128}", text):
        return bytes.fromhex(text)
    if re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", text):
        decoder = base64.b64decode
    elif re.fullmatch(r"[A-Za-z0-9_-]+={0,2}", text):
        decoder = base64.urlsafe_b64decode
    else:
        return None
    if len(text.rstrip("=")) % 4 == 1:
        return None
    try:
        return decoder(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4))
    except (binascii.Error, ValueError):
        return None


def _parse_private(data: bytes) -> Ed25519PrivateKey:
    data = data.strip()
    if not data:
        raise _BadKey("is empty")
    if data.startswith(b"-----BEGIN"):
        if b"\n" not in data and b"\\n" in data:  # PEM pasted into a CI secret with literal \n
            data = data.replace(b"\\n", b"\n")
        passphrase = os.environ.get(PASSPHRASE_ENV)
        password = passphrase.encode("utf-8") if passphrase else None
        try:
            if b"OPENSSH PRIVATE KEY" in data:
                key = serialization.load_ssh_private_key(data, password)
            else:
                key = serialization.load_pem_private_key(data, password)
        except TypeError:
            if password is None:
                raise _BadKey(f"is encrypted; set {PASSPHRASE_ENV} to its passphrase") from None
            raise _BadKey("is not encrypted, but a passphrase was given") from None
        except (ValueError, UnsupportedAlgorithm):
            raise _BadKey("is not a readable PEM/OpenSSH private key (or the passphrase is wrong)") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise _BadKey(f"holds a {type(key).__name__.lstrip('_')} key; cudagate signs with Ed25519 only")
        return key
    if b"PUBLIC KEY" in data or data.startswith(b"ssh-"):
        raise _BadKey("holds a public key; signing needs the private key")
    try:
        raw = _decode_compact(data.decode("ascii"))
    except UnicodeDecodeError:
        raw = None
    if raw is None:
        raise _BadKey("is neither a PEM private key nor base64/hex of a raw 32-byte Ed25519 key")
    return _raw_private(raw)


def load_private_key(path: str | Path | None = None) -> Ed25519PrivateKey:
    """The signing key from ``path``, else from ``$CUDAGATE_SIGNING_KEY`` (PEM text, or base64/hex of
    the raw 32 bytes). Errors name the file or the variable and never include key material."""
    if path is not None:
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise FileError(path, [f"cannot read the private key: {exc.strerror}",
                                   "fix: pass the file `cudagate keygen` wrote, or set " + SIGNING_KEY_ENV]) from None
        try:
            return _parse_private(data)
        except _BadKey as exc:
            raise FileError(path, [f"this private key file {exc}"]) from None
    value = os.environ.get(SIGNING_KEY_ENV)
    if not value or not value.strip():
        raise CudagateError(f"no signing key: pass --key FILE (written by `cudagate keygen`) or set {SIGNING_KEY_ENV} "
                            "to the private key (PEM text, or base64 of the raw 32 bytes)")
    try:
        return _parse_private(value.encode("utf-8", "replace"))
    except _BadKey as exc:
        raise CudagateError(f"{SIGNING_KEY_ENV} is set, but its value {exc} (the value is not shown)") from None


def private_key_mode_warning(path: Path) -> str | None:
    """A warning when a private key file can be read by other users (POSIX only)."""
    if sys.platform == "win32":
        return None
    try:
        mode = stat.S_IMODE(Path(path).stat().st_mode)
    except OSError:
        return None
    if mode & 0o077:
        return (f"warning: {display_path(path)} is readable by other users (mode {mode:04o}); "
                f"run `{command('chmod', '600', Path(path))}`")
    return None


# --------------------------------------------------------------------------- public keys


def load_public_key(path: Path) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (``BEGIN PUBLIC KEY``) or OpenSSH (``ssh-ed25519 AAAA...``)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FileError(path, [f"cannot read the public key: {exc.strerror}"]) from None
    return public_key_from_bytes(data, path)


def public_key_from_bytes(data: bytes, where) -> Ed25519PublicKey:
    """:func:`load_public_key` for bytes read elsewhere (a git object); ``where`` names them in errors."""
    data = data.strip()
    if b"PRIVATE KEY" in data:
        raise FileError(where, ["this file holds a PRIVATE key, not a public one",
                                "fix: delete it from the repository now, treat the key as leaked, and generate a new "
                                "one with `cudagate keygen` (only NAME.pub belongs under .cudagate/trusted_keys/)"])
    try:
        if data.startswith(b"ssh-"):
            key = serialization.load_ssh_public_key(data)
        elif data.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            raw = _decode_compact(data.decode("ascii"))
            if raw is None or len(raw) != 32:
                raise ValueError
            key = Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, UnicodeDecodeError, UnsupportedAlgorithm):
        raise FileError(where, ["not a readable public key (expected PEM 'BEGIN PUBLIC KEY', as `cudagate keygen` "
                                "writes, or 'ssh-ed25519 ...')"]) from None
    if not isinstance(key, Ed25519PublicKey):
        raise FileError(where, [f"holds a {type(key).__name__.lstrip('_')} public key; cudagate trusts Ed25519 keys only"])
    return key


class TrustedKeys(dict):
    """``key_id -> Ed25519PublicKey``, remembering where each key came from (for messages)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sources: dict[str, list[str]] = {}
        self.excluded: dict[str, str] = {}  # key id -> why it was left out
        self.searched: list[str] = []

    def describe(self, kid: str) -> str:
        files = self.sources.get(kid)
        return f"{kid} ({', '.join(files)})" if files else kid

    def where(self) -> str:
        return " and ".join(self.searched) if self.searched else "no location"


def _public_key_files(folder: Path) -> list[Path]:
    return [path for path in walk(folder, "trusted-keys folder") if path.name.endswith(".pub")]


def _settings_key_files(root: Path, entries) -> list[tuple[Path, str]]:
    files = []
    for entry in entries:
        path = Path(entry)
        path = path if path.is_absolute() else root / path
        if path.is_dir():
            files.extend((p, entry) for p in _public_key_files(path))
        elif path.is_file():
            files.append((path, entry))
        else:
            raise FileError(root / "pyproject.toml",
                            [f"tool.cudagate.trusted_keys: {entry!r} is neither a file nor a folder "
                             f"(looked for {path})"])
    return files


def load_trusted_keys(project_root: Path, settings=None) -> TrustedKeys:
    """Every ``*.pub`` under ``<project_root>/.cudagate/trusted_keys/``, plus the files or folders listed
    in ``[tool.cudagate] trusted_keys`` (relative to the project root). Several keys may be trusted at
    once (rotation); deleting a ``.pub`` revokes whatever only that key signed.

    If ``$CUDAGATE_TRUSTED_KEY_IDS`` is set (comma/space separated key ids, e.g. a CI variable), only
    keys with those ids are trusted, so a pull request that adds its own ``.pub`` gains nothing.
    """
    project_root = Path(project_root)
    if settings is None:
        from pytest_cudagate.config import load_settings

        settings = load_settings(project_root)
    keys = TrustedKeys()
    folder = project_root / TRUSTED_KEYS_DIR
    files: list[tuple[Path, str]] = []
    keys.searched.append(f"{display_path(folder)}/*.pub")
    if folder.is_dir():
        files.extend((p, None) for p in _public_key_files(folder))
    entries = tuple(getattr(settings, "trusted_keys", ()) or ())
    if entries:
        keys.searched.append("[tool.cudagate] trusted_keys (" + ", ".join(entries) + ")")
        files.extend(_settings_key_files(Path(getattr(settings, "root", project_root)), entries))
    for path, _entry in files:
        add_key(keys, load_public_key(path), display_path(path))
    return filter_by_allowed_ids(keys)


def add_key(keys: TrustedKeys, public: Ed25519PublicKey, source: str) -> None:
    """Trust ``public``, remembering ``source``; two different keys with one id are refused."""
    kid = key_id(public)
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if kid in keys and keys[kid].public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) != raw:
        raise FileError(source, [f"key id {kid} is also the id of a different key in {', '.join(keys.sources[kid])}"])
    keys[kid] = public
    keys.sources.setdefault(kid, [])
    if source not in keys.sources[kid]:
        keys.sources[kid].append(source)


def filter_by_allowed_ids(keys: TrustedKeys) -> TrustedKeys:
    """Keep only the keys ``$CUDAGATE_TRUSTED_KEY_IDS`` lists, when it is set (a root outside the repository)."""
    allowed = os.environ.get(TRUSTED_IDS_ENV)
    if allowed is not None and allowed.strip():
        wanted = {k.strip().lower() for k in re.split(r"[,\s]+", allowed) if k.strip()}
        for kid in list(keys):
            if kid not in wanted:
                keys.excluded[kid] = f"{TRUSTED_IDS_ENV} does not list it"
                del keys[kid]
        keys.searched.append(f"filtered by {TRUSTED_IDS_ENV}")
    return keys
