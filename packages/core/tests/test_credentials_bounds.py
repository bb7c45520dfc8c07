"""Every file and process the AWS credential chain touches is bounded (issue 48, round 4).

A ``credential_process`` is stopped at its timeout or at Ctrl-C, killed with every process it
started and reaped; its output is capped and its stderr never reaches ours. Web identity and
container token files, the shared config and credentials files and ``AWS_CA_BUNDLE`` must be
small regular files: a FIFO, a device or a directory is refused without blocking, a file past
its cap before it is read. Each case is an error of the package's hierarchy naming the file,
profile or command and the bound.

The chain is looked at by the first ``s3://`` request, before anything is sent, so no server is
needed: the endpoint is a closed port. Each case runs in a fresh interpreter under an
address-space cap with a time limit, so a hang or an endless read fails the test instead of the
session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# The environment of the test process must not hand the chain other credentials.
_CHAIN_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CA_BUNDLE",
    "O41_CREDENTIAL_PROCESS_TIMEOUT",
)
CAP_BYTES = 2 << 30
# What a helper prints on stderr: a key id and a secret in the shapes of AWS's own examples.
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
# Caps from docs/storage.md ("Bounds of the credential chain").
MAX_PROCESS_OUTPUT = 64 << 10
MAX_TOKEN_FILE = 16 << 10
MAX_PROFILE_FILE = 16 << 20
MAX_CA_BUNDLE = 16 << 20


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The child's environment: no AWS settings, an empty home, no instance metadata."""
    home = tmp_path / "home"
    home.mkdir()
    base = {k: v for k, v in os.environ.items() if k not in _CHAIN_VARIABLES}
    return {**base, "HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true", "RAYON_NUM_THREADS": "1"}


def first_read(env: dict[str, str], profile: str | None = None, interrupt_when: Path | None = None) -> str:
    """The outcome of the first ``s3://`` read in a fresh interpreter with ``env``.

    ``ErrorClass | option | message``, or ``KeyboardInterrupt`` when ``interrupt_when`` names a
    file whose appearance sends Ctrl-C. Fails the test if the child hangs (60 s: the bounds
    under test are one second or less) or dies. The child's stderr must not carry the secrets
    of a helper's stderr.
    """
    code = textwrap.dedent(
        f"""
        import resource, threading, time, _thread
        from pathlib import Path
        resource.setrlimit(resource.RLIMIT_AS, ({CAP_BYTES}, {CAP_BYTES}))
        from o41_training_data import O41Error, RetryPolicy, TrainingData, iter_shard
        when = {None if interrupt_when is None else str(interrupt_when)!r}
        def interrupt():
            while not Path(when).exists():
                time.sleep(0.01)
            _thread.interrupt_main()
        if when is not None:
            threading.Thread(target=interrupt, daemon=True).start()
        try:
            data = TrainingData(
                s3_base_url="http://127.0.0.1:9",
                profile={profile!r},
                retry=RetryPolicy(max_consecutive_failures=1, connect_timeout_s=1.0),
            )
            next(iter_shard("jsonl", "s3://bucket/part-0.jsonl", data.storage_config))
        except O41Error as err:
            print(type(err).__name__, "|", err.option, "|", err, flush=True)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
        else:
            print("no error", flush=True)
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the first s3:// read hung (or something it started kept its output open)")
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    for secret in (KEY_ID, SECRET, "corp-login"):
        assert secret not in done.stderr, done.stderr
    return done.stdout.strip()


def pid_in(path: Path) -> int:
    return int(path.read_text().strip())


def ended(pid: int) -> bool:
    """True once ``pid`` is gone, or a zombie (ended, waiting for a parent that is not us)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def assert_gone(helper: int, grandchild: int) -> None:
    """The helper was reaped by the engine; what it started was killed with it."""
    try:
        with pytest.raises(ProcessLookupError):
            os.kill(helper, 0)
        # SIGKILL reached the grandchild with the helper's group; its end is the kernel's to
        # finish and its reaping its new parent's, so look until it has ended.
        for _ in range(1000):
            if ended(grandchild):
                break
            time.sleep(0.01)
        assert ended(grandchild), f"process {grandchild}, started by the helper, still runs"
    finally:
        for pid in (helper, grandchild):
            if not ended(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def stuck_profile(tmp_path: Path, env: dict[str, str]) -> Path:
    """Profile ``stuck``: a helper that starts a grandchild and never exits; yields the pid folder."""
    helper = tmp_path / "helper.sh"
    helper.write_text(
        'echo $$ > "$1/helper.pid.tmp" && mv "$1/helper.pid.tmp" "$1/helper.pid"\n'
        "sleep 600 &\n"
        'echo $! > "$1/grandchild.pid.tmp" && mv "$1/grandchild.pid.tmp" "$1/grandchild.pid"\n'
        "wait\n"
    )
    config = tmp_path / "config"
    config.write_text(f"[profile stuck]\ncredential_process = /bin/sh {helper} {tmp_path}\n")
    env["AWS_CONFIG_FILE"] = str(config)
    return tmp_path


def test_a_credential_process_that_never_exits_is_killed_at_its_timeout(
    env: dict[str, str], stuck_profile: Path
) -> None:
    env["O41_CREDENTIAL_PROCESS_TIMEOUT"] = "1"
    outcome = first_read(env, profile="stuck")
    assert outcome.startswith("AccessDeniedError"), outcome
    assert "credential_process of profile 'stuck'" in outcome, outcome
    assert "/bin/sh" in outcome, outcome
    assert "did not finish within 1 s (O41_CREDENTIAL_PROCESS_TIMEOUT)" in outcome, outcome
    assert_gone(pid_in(stuck_profile / "helper.pid"), pid_in(stuck_profile / "grandchild.pid"))


def test_ctrl_c_stops_a_credential_process_and_leaves_nothing_holding_our_output(
    env: dict[str, str], stuck_profile: Path
) -> None:
    # The default timeout (60 s) is far off: only Ctrl-C ends the wait. Were the helper left
    # running with our stderr, the child's output would stay open and first_read would hang.
    outcome = first_read(env, profile="stuck", interrupt_when=stuck_profile / "grandchild.pid")
    assert outcome == "KeyboardInterrupt"
    assert_gone(pid_in(stuck_profile / "helper.pid"), pid_in(stuck_profile / "grandchild.pid"))


def test_a_credential_process_stderr_is_captured_and_scrubbed(tmp_path: Path, env: dict[str, str]) -> None:
    helper = tmp_path / "helper.sh"
    helper.write_text(
        f'echo "corp-login failed for {KEY_ID} (secret {SECRET}); run corp-login --renew" >&2\nexit 3\n'
    )
    config = tmp_path / "config"
    config.write_text(f"[profile failing]\ncredential_process = /bin/sh {helper}\n")
    env["AWS_CONFIG_FILE"] = str(config)
    outcome = first_read(env, profile="failing")
    assert outcome.startswith("AccessDeniedError"), outcome
    assert "credential_process of profile 'failing'" in outcome, outcome
    assert "exit status: 3" in outcome, outcome
    # What it said is in the error, cleaned of what looks like a key; our stderr has none of it.
    assert "corp-login failed for <redacted> (secret <redacted>); run corp-login --renew" in outcome, outcome
    assert KEY_ID not in outcome
    assert "K7MDENG" not in outcome


def test_a_credential_process_printing_without_end_is_stopped_at_the_output_cap(
    tmp_path: Path, env: dict[str, str]
) -> None:
    config = tmp_path / "config"
    config.write_text("[profile endless]\ncredential_process = yes AKIA\n")
    env["AWS_CONFIG_FILE"] = str(config)
    outcome = first_read(env, profile="endless")
    assert outcome.startswith("AccessDeniedError"), outcome
    assert "credential_process of profile 'endless'" in outcome, outcome
    assert f"printed more than {MAX_PROCESS_OUTPUT} bytes" in outcome, outcome


def special_file(kind: str, tmp_path: Path, cap: int) -> tuple[Path, str]:
    """A file of ``kind`` and what the refusal says about it."""
    if kind == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
        return path, "is a FIFO, not a regular file"
    if kind == "device":
        return Path("/dev/zero"), "is a character device, not a regular file"
    if kind == "directory":
        path = tmp_path / "directory"
        path.mkdir()
        return path, "is a directory, not a regular file"
    path = tmp_path / "huge"
    with path.open("wb") as out:
        out.truncate(cap + 1)  # sparse: costs no disk
    return path, f"is {cap + 1} bytes, more than the {cap} bytes"


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_web_identity_token_file_must_be_a_small_regular_file(
    tmp_path: Path, env: dict[str, str], kind: str
) -> None:
    path, says = special_file(kind, tmp_path, MAX_TOKEN_FILE)
    env.update(
        AWS_WEB_IDENTITY_TOKEN_FILE=str(path),
        AWS_ROLE_ARN="arn:aws:iam::123456789012:role/train",
        AWS_ENDPOINT_URL_STS="http://127.0.0.1:9",
    )
    outcome = first_read(env)
    assert outcome.startswith("AccessDeniedError"), outcome
    assert "AWS_WEB_IDENTITY_TOKEN_FILE" in outcome, outcome
    assert f"{path} {says}" in outcome, outcome


def test_a_profile_web_identity_token_file_must_be_a_small_regular_file(
    tmp_path: Path, env: dict[str, str]
) -> None:
    path, says = special_file("fifo", tmp_path, MAX_TOKEN_FILE)
    config = tmp_path / "config"
    config.write_text(
        f"[profile irsa]\nrole_arn = arn:aws:iam::123456789012:role/train\nweb_identity_token_file = {path}\n"
    )
    env.update(AWS_CONFIG_FILE=str(config), AWS_ENDPOINT_URL_STS="http://127.0.0.1:9")
    outcome = first_read(env, profile="irsa")
    assert outcome.startswith("AccessDeniedError"), outcome
    assert "web identity (profile 'irsa'): web_identity_token_file" in outcome, outcome
    assert f"{path} {says}" in outcome, outcome


def test_a_container_authorization_token_file_must_be_a_regular_file(
    tmp_path: Path, env: dict[str, str]
) -> None:
    path, says = special_file("fifo", tmp_path, MAX_TOKEN_FILE)
    env.update(
        AWS_CONTAINER_CREDENTIALS_FULL_URI="http://127.0.0.1:9/v1/credentials",
        AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=str(path),
    )
    outcome = first_read(env)
    assert outcome.startswith("AccessDeniedError"), outcome
    assert f"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {path} {says}" in outcome, outcome


@pytest.mark.parametrize(
    ("variable", "kind"),
    [
        ("AWS_CONFIG_FILE", "fifo"),
        ("AWS_CONFIG_FILE", "device"),
        ("AWS_CONFIG_FILE", "directory"),
        ("AWS_CONFIG_FILE", "huge"),
        ("AWS_SHARED_CREDENTIALS_FILE", "fifo"),
    ],
)
def test_the_shared_files_must_be_small_regular_files(
    tmp_path: Path, env: dict[str, str], variable: str, kind: str
) -> None:
    path, says = special_file(kind, tmp_path, MAX_PROFILE_FILE)
    env[variable] = str(path)
    outcome = first_read(env)
    assert outcome.startswith("AccessDeniedError"), outcome
    assert f"{path} {says}" in outcome, outcome
    assert "shared config or credentials file" in outcome, outcome


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("fifo", "is not a regular file (a CA bundle must be a regular file)"),
        ("device", "is not a regular file (a CA bundle must be a regular file)"),
        ("directory", "is a directory (a CA bundle must be a regular file)"),
        ("huge", f"is {MAX_CA_BUNDLE + 1} bytes, more than a CA bundle may be ({MAX_CA_BUNDLE})"),
    ],
)
def test_the_ca_bundle_must_be_a_small_regular_file(
    tmp_path: Path, env: dict[str, str], kind: str, says: str
) -> None:
    # Was a hang (FIFO), a MemoryError (/dev/zero) or a 16 MiB read handed to the TLS client.
    path, _ = special_file(kind, tmp_path, MAX_CA_BUNDLE)
    env.update(AWS_CA_BUNDLE=str(path), AWS_ACCESS_KEY_ID="AKIAEXAMPLE", AWS_SECRET_ACCESS_KEY="example")
    outcome = first_read(env)
    assert outcome == f"ConfigError | ca_bundle | invalid ca_bundle: {path}: {says}", outcome
