"""trust.keys: trusted keys (unknown, rotation, revocation, settings, pinned ids) and private keys (forms,
passphrases, the environment), never leaking key material."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.trust import (SIGNATURE_FILENAME, SIGNING_KEY_ENV, TRUSTED_IDS_ENV, find_project_root,
                                   generate_key_pair, key_id, load_private_key, load_public_key)
from pytest_cudagate.trust.cli import main as trust_main
from trust_project import clean_env, project  # noqa: F401 (fixtures)


# --------------------------------------------------------------------------- keys: unknown, rotation, revocation


def test_signature_by_unknown_key_fails_naming_it(project):
    mallory = project.new_key("mallory", trusted=False)
    project.sign(mallory, signer="mallory")
    result = project.verify()
    assert not result.ok and result.key_id == mallory.key_id
    text = "\n".join(result.problems)
    assert f"signed by key {mallory.key_id} (signer mallory), which is not trusted" in text
    assert SIGNATURE_FILENAME in text
    assert p_fix_mentions_trusted_keys(result.fix)


def p_fix_mentions_trusted_keys(fix: str) -> bool:
    return ".cudagate/trusted_keys/" in fix and "cudagate sign" in fix


def test_key_rotation_either_trusted_key_verifies(project):
    bob = project.new_key("bob")
    assert set(project.trusted()) == {project.alice.key_id, bob.key_id}
    project.sign(bob, signer="bob")
    result = project.verify()
    assert result.ok and result.key_id == bob.key_id and result.signer == "bob"
    project.sign(project.alice)
    result = project.verify()
    assert result.ok and result.key_id == project.alice.key_id and result.signer == "alice"


def test_revocation_removing_the_signers_pub_fails_naming_the_key(project):
    project.new_key("bob")
    project.alice.public_path.unlink()
    result = project.verify()
    assert not result.ok
    text = "\n".join(result.problems)
    assert project.alice.key_id in text and "not trusted" in text
    assert "signer alice" in text


def test_trusted_keys_from_settings(project, tmp_path):
    carol = generate_key_pair("carol", private_path=tmp_path / "ext" / "carol.key", public_path=tmp_path / "ext" / "carol.pub")
    project.sign(carol, signer="carol")
    assert not project.verify().ok
    (project.root / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\n[tool.cudagate]\ntrusted_keys = [{json.dumps(str(tmp_path / "ext" / "carol.pub"))}]\n')
    assert carol.key_id in project.trusted()
    assert project.verify().ok


def test_missing_settings_key_path_is_a_clear_error(project):
    (project.root / "pyproject.toml").write_text('[tool.cudagate]\ntrusted_keys = ["keys/nowhere.pub"]\n')
    with pytest.raises(FileError) as info:
        project.trusted()
    assert info.value.path.endswith("pyproject.toml") and "keys/nowhere.pub" in str(info.value)


def test_trusted_key_ids_env_pins_the_trust_root(project, monkeypatch):
    intruder = project.new_key("intruder")  # a pull request adding its own .pub
    project.sign(intruder, signer="intruder")
    assert project.verify().ok
    monkeypatch.setenv(TRUSTED_IDS_ENV, project.alice.key_id)
    result = project.verify()
    assert not result.ok and f"{TRUSTED_IDS_ENV} does not list it" in "\n".join(result.problems)
    project.sign()
    assert project.verify().ok


def test_public_key_file_holding_a_private_key_is_refused(project):
    leaked = project.root / ".cudagate" / "trusted_keys" / "oops.pub"
    pem = project.alice.private_path.read_text()
    leaked.write_text(pem)
    with pytest.raises(FileError) as info:
        project.trusted()
    assert "PRIVATE key" in str(info.value) and pem.splitlines()[1] not in str(info.value)


def test_public_keys_in_openssh_form_are_accepted(project, tmp_path):
    public = load_public_key(project.alice.public_path)
    ssh = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (tmp_path / "alice_ssh.pub").write_bytes(ssh + b" alice@laptop\n")
    assert key_id(load_public_key(tmp_path / "alice_ssh.pub")) == project.alice.key_id


def test_key_id_is_sha256_prefix_of_raw_public_key(project):
    raw = load_public_key(project.alice.public_path).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert project.alice.key_id == hashlib.sha256(raw).hexdigest()[:16]


def test_find_project_root(project, tmp_path):
    assert find_project_root(project.suite_dir) == project.root.resolve()
    assert find_project_root(project.suite_file) == project.root.resolve()
    (tmp_path / "git_only" / ".git").mkdir(parents=True)
    (tmp_path / "git_only" / "a" / "b").mkdir(parents=True)
    assert find_project_root(tmp_path / "git_only" / "a" / "b") == (tmp_path / "git_only").resolve()


def _secrets(private_path: Path) -> list[bytes]:
    pem = private_path.read_bytes()
    key = load_private_key(private_path)
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    body = b"".join(line for line in pem.splitlines() if not line.startswith(b"-----"))
    forms = [pem.strip(), body, raw, raw.hex().encode(), raw.hex().upper().encode(), base64.b64encode(raw),
             base64.b64encode(raw).rstrip(b"="), base64.urlsafe_b64encode(raw).rstrip(b"=")]
    return forms


def _scan(secrets: list[bytes], text: bytes, where: str) -> None:
    for secret in secrets:
        assert secret not in text, f"private key material found in {where}"


def test_private_key_never_leaks(project, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(project.root)
    captured = []

    def run(argv, env_value=None):
        if env_value is None:
            monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
        else:
            monkeypatch.setenv(SIGNING_KEY_ENV, env_value)
        rc = trust_main(argv)
        out = capsys.readouterr()
        captured.append(out.out + out.err)
        return rc

    assert run(["keygen", "--name", "erin"]) == 0
    private = Path(os.environ["XDG_CONFIG_HOME"]) / "cudagate" / "keys" / "erin.key"
    secrets = _secrets(private)
    pem = private.read_text()
    raw_b64 = base64.b64encode(_secrets(private)[2]).decode()
    suite = str(project.suite_file)
    assert run(["sign", suite, "--key", str(private)]) == 0
    assert run(["verify", suite]) == 0
    assert run(["sign", suite, "--signer", "erin"]) == 0  # found in the default key folder
    assert run(["sign", suite], env_value=pem) == 0
    assert run(["sign", suite], env_value=raw_b64) == 0
    project.edit(lambda r: r["tolerance"]["y"].update(atol=0.5))
    assert run(["verify", suite]) == 1
    # broken keys: the error must describe, never echo
    assert run(["sign", suite], env_value=pem[:-40]) == 2
    assert run(["sign", suite], env_value=raw_b64[:-3] + "!!") == 2
    assert run(["sign", suite], env_value=raw_b64 + "AAAA") == 2
    broken = tmp_path / "broken.key"
    broken.write_text(pem.replace("\n-----END", "X\n-----END"))
    assert run(["sign", suite, "--key", str(broken)]) == 2
    assert run(["sign", suite, "--key", str(project.alice.public_path)]) == 2
    for text in captured:
        _scan(secrets, text.encode(), "command output")
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.resolve() != private.resolve() and path != broken:
            _scan(secrets, path.read_bytes(), str(path))
    assert any("not shown" in t for t in captured)


def test_private_key_errors_name_the_source_without_material(project, monkeypatch, tmp_path):
    pem = project.alice.private_path.read_text()
    monkeypatch.setenv(SIGNING_KEY_ENV, pem.replace("M", "N"))
    with pytest.raises(CudagateError) as info:
        load_private_key(None)
    assert SIGNING_KEY_ENV in str(info.value)
    for line in pem.splitlines()[1:-1]:
        assert line not in str(info.value) and line.replace("M", "N") not in str(info.value)
    monkeypatch.delenv(SIGNING_KEY_ENV)
    with pytest.raises(CudagateError) as info:
        load_private_key(None)
    assert "--key FILE" in str(info.value) and SIGNING_KEY_ENV in str(info.value)
    with pytest.raises(FileError) as info:
        load_private_key(tmp_path / "nope.key")
    assert info.value.path.endswith("nope.key")


@pytest.mark.parametrize("form", ["pem", "pem-escaped-newlines", "base64", "base64-urlsafe-nopad", "hex"])
def test_env_var_signing_key(project, monkeypatch, capsys, form):
    key = project.key()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    pem = project.alice.private_path.read_text()
    value = {"pem": pem, "pem-escaped-newlines": pem.replace("\n", "\\n"), "base64": base64.b64encode(raw).decode(),
             "base64-urlsafe-nopad": base64.urlsafe_b64encode(raw).decode().rstrip("="), "hex": raw.hex()}[form]
    monkeypatch.setenv(SIGNING_KEY_ENV, value)
    assert key_id(load_private_key(None)) == project.alice.key_id
    project.edit(lambda r: r["tolerance"]["y"].update(atol=1e-5))
    assert trust_main(["sign", str(project.suite_dir)]) == 0
    out = capsys.readouterr().out
    assert f"as alice with key {project.alice.key_id}" in out  # signer named after the trusted alice.pub
    result = project.verify()
    assert result.ok and result.key_id == project.alice.key_id


def test_encrypted_private_key_needs_passphrase(project, tmp_path, monkeypatch):
    key = project.key()
    enc = tmp_path / "enc.key"
    enc.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(b"s3cret-pass")))
    with pytest.raises(FileError) as info:
        load_private_key(enc)
    assert "CUDAGATE_SIGNING_KEY_PASSPHRASE" in str(info.value)
    monkeypatch.setenv("CUDAGATE_SIGNING_KEY_PASSPHRASE", "s3cret-pass")
    assert key_id(load_private_key(enc)) == project.alice.key_id


