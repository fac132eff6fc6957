"""TLS on real loopback servers and clients, with certificates made by ``netopt tls``.

Each refusal (wrong CA, expired, not yet valid, wrong host name, no client certificate
under mutual TLS, plain HTTP against TLS and back, a downgrade, the token over plaintext
to another host) is a clean CLI error naming the cause; a sync over mutual TLS is byte
for byte; no key or token reaches a log or ``--json``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tls_helpers import (
    NOW,
    TOKEN,
    NodeFiles,
    Pki,
    make_pki,
    run_cli,
    thread_server,
)

from netopt.config import load_settings
from netopt.coordinator.server import serve
from netopt.errors import ConfigError, TlsError, UsageError
from netopt.tlsconf import (
    ClientTls,
    ServerTls,
    client_context,
    client_ssl,
    section_client_tls,
    server_context,
    use_client_tls,
)
from netopt.webshell import ListenerLimits
from netopt.wire.client import CoordinatorClient

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server_files(pki: Pki) -> NodeFiles:
    return pki.issue("server-1")


@pytest.fixture(scope="module")
def client_files(pki: Pki) -> NodeFiles:
    return pki.issue("client-1", ips=(), dns=())


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETOPT_TOKEN", TOKEN)
    for name in ("NETOPT_TLS_CA", "NETOPT_TLS_CERT", "NETOPT_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)


def _context(files: NodeFiles, ca: Path | None = None, mutual: bool = False) -> object:
    return server_context(
        ServerTls(str(files.cert), str(files.key), str(ca) if ca else None, mutual)
    )


def _status(capsys: pytest.CaptureFixture[str], url: str, *extra: str) -> tuple[int, str]:
    code = run_cli(["status", "--coordinator", url, "--json", *extra])
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    assert TOKEN not in text
    return code, text


def test_tls_init_and_issue_write_0600_files_and_never_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "tls"
    assert run_cli(["tls", "init", "--dir", str(root), "--json"]) == 0
    assert run_cli(["tls", "issue", "n1", "--dir", str(root), "--ip", "127.0.0.1", "--json"]) == 0
    out = capsys.readouterr().out
    for name in ("ca.pem", "ca-key.pem", "n1.pem", "n1-key.pem"):
        assert (root / name).stat().st_mode & 0o777 == 0o600, name
    assert "PRIVATE KEY" not in out  # paths only
    key_before = (root / "n1-key.pem").read_bytes()
    assert run_cli(["tls", "issue", "n1", "--dir", str(root), "--json"]) == 2
    assert "--force" in capsys.readouterr().out
    assert (root / "n1-key.pem").read_bytes() == key_before
    assert run_cli(["tls", "init", "--dir", str(root)]) == 2  # the CA is kept too
    assert run_cli(["tls", "renew", "n1", "--dir", str(root), "--ip", "127.0.0.1"]) == 0
    assert (root / "n1-key.pem").read_bytes() != key_before
    assert (root / "n1-key.pem").stat().st_mode & 0o777 == 0o600


def test_tls_issue_out_writes_a_node_directory_without_the_ca_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out``: what a Kubernetes init container writes for the agent beside it."""
    ca_dir, node_dir = tmp_path / "ca", tmp_path / "node"
    assert run_cli(["tls", "init", "--dir", str(ca_dir)]) == 0
    capsys.readouterr()
    argv = ["tls", "issue", "n1", "--dir", str(ca_dir), "--out", str(node_dir),
            "--ip", "127.0.0.1", "--json"]  # fmt: skip
    assert run_cli(argv) == 0
    assert json.loads(capsys.readouterr().out)["ca"] == str(node_dir / "ca.pem")
    assert sorted(p.name for p in node_dir.iterdir()) == ["ca.pem", "n1-key.pem", "n1.pem"]
    assert sorted(p.name for p in ca_dir.iterdir()) == ["ca-key.pem", "ca.pem"]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in node_dir.iterdir())
    assert (node_dir / "ca.pem").read_bytes() == (ca_dir / "ca.pem").read_bytes()
    # The pair loads and chains to the copied CA.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(node_dir / "n1.pem", node_dir / "n1-key.pem")
    ctx.load_verify_locations(node_dir / "ca.pem")
    assert run_cli(argv) == 2  # kept without --force, as in the CA's directory
    assert run_cli([*argv, "--force"]) == 0


def test_status_over_tls_and_mutual_tls(
    pki: Pki,
    server_files: NodeFiles,
    client_files: NodeFiles,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with thread_server(_context(server_files)) as url:  # type: ignore[arg-type]
        code, text = _status(capsys, url, "--tls-ca", str(pki.ca))
        assert code == 0, text
    with thread_server(_context(server_files, pki.ca, mutual=True)) as url:  # type: ignore[arg-type]
        code, _ = _status(
            capsys, url, "--tls-ca", str(pki.ca),
            "--tls-cert", str(client_files.cert), "--tls-key", str(client_files.key),
        )  # fmt: skip
        assert code == 0
        code, text = _status(capsys, url, "--tls-ca", str(pki.ca))
        assert code == 1
        assert "requires a client certificate" in text, text


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("wrong-ca", "wrong CA"),
        ("expired", "has expired"),
        ("not-yet-valid", "not yet valid"),
        ("wrong-host", "wrong host name"),
    ],
)
def test_a_bad_server_certificate_is_refused_naming_the_cause(
    tmp_path: Path, pki: Pki, case: str, cause: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if case == "wrong-ca":
        files = make_pki(tmp_path / "other", "another CA").issue("server-1")
    elif case == "expired":
        files = pki.issue("old", now=NOW - dt.timedelta(days=40), days=30)
    elif case == "not-yet-valid":
        files = pki.issue("future", now=NOW + dt.timedelta(days=10))
    else:
        files = pki.issue("elsewhere", ips=("127.0.0.2",), dns=("elsewhere.example",))
    with thread_server(_context(files)) as url:  # type: ignore[arg-type]
        code, text = _status(capsys, url, "--tls-ca", str(pki.ca))
    assert code == 1
    assert json.loads(text)["error"] == "TlsError"
    assert cause in text, text


def test_plaintext_and_tls_mismatches_are_refused_naming_the_cause(
    pki: Pki, server_files: NodeFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    with thread_server(_context(server_files)) as url:  # type: ignore[arg-type]
        plain = url.replace("https://", "http://")
        code, text = _status(capsys, plain)  # plain HTTP against the TLS server
        assert code == 1
        assert "TLS server closes plain HTTP" in text, text
        code, text = _status(capsys, plain, "--tls-ca", str(pki.ca))  # a downgrade
        assert code == 1
        assert "plain http:// while TLS is configured" in text, text
    with thread_server(None) as url:
        code, text = _status(capsys, url.replace("http://", "https://"), "--tls-ca", str(pki.ca))
        assert code == 1
        assert "does not speak TLS" in text, text


def test_the_token_never_goes_in_plaintext_to_another_host(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Refused before any connection: nothing is sent to the (unrouted) address.
    code, text = _status(capsys, "http://198.18.0.1:9")
    assert code == 2
    assert "refusing to send the token in plaintext to 198.18.0.1" in text, text
    use_client_tls(ClientTls(insecure=True))
    try:
        with caplog.at_level(logging.WARNING, "netopt.tlsconf"):
            assert client_ssl("http://198.18.0.2:9/x", sends_token=True) is None
            assert client_ssl("http://198.18.0.2:9/y", sends_token=True) is None
        assert len([r for r in caplog.records if "198.18.0.2" in r.getMessage()]) == 1
    finally:
        use_client_tls(ClientTls())
    assert client_ssl("http://127.0.0.1:9/", sends_token=True) is None  # loopback is fine


def test_the_agents_listener_setting_does_not_open_its_clients_to_plaintext(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``allow_plaintext`` is the listener's; only ``insecure`` lets the agent's own clients
    send the token over plain HTTP to another host (checked before any connection)."""
    config = tmp_path / "agent.yaml"
    base = "kind: agent\nnode: hk-1\nregion: hk\ntoken: agent-token-0123456789\n"
    config.write_text(base + "tls: {allow_plaintext: true}\n")
    use_client_tls(section_client_tls(load_settings(str(config), "agent").tls, "agent.yaml"))
    try:
        with pytest.raises(UsageError, match=r"in plaintext to 198\.18\.0\.3.*tls\.insecure"):
            client_ssl("http://198.18.0.3:9/x", sends_token=True)
        config.write_text(base + "tls: {insecure: true}\n")
        section = load_settings(str(config), "agent").tls
        assert not section.allow_plaintext
        use_client_tls(section_client_tls(section, "agent.yaml"))
        with caplog.at_level(logging.WARNING, "netopt.tlsconf"):
            assert client_ssl("http://198.18.0.3:9/x", sends_token=True) is None
        assert any("198.18.0.3" in r.getMessage() for r in caplog.records)
    finally:
        use_client_tls(ClientTls())
    coordinator = tmp_path / "c.yaml"
    coordinator.write_text("kind: coordinator\ntls: {insecure: true}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*tls\.insecure.*sends no requests"):
        load_settings(str(coordinator), "coordinator")


async def test_the_coordinator_serves_mutual_tls_from_its_config(
    tmp_path: Path, pki: Pki, server_files: NodeFiles, client_files: NodeFiles
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "kind: coordinator\nlisten: {host: 127.0.0.1, port: 0}\n"
        f"token: {TOKEN}\ndatabase: {tmp_path / 'c.db'}\n"
        f"tls: {{cert: {server_files.cert}, key: {server_files.key}, ca: {pki.ca}, "
        "require_client_cert: true}\n"
    )
    settings = load_settings(str(config), "coordinator")
    stop = asyncio.Event()
    ports: list[int] = []
    task = asyncio.create_task(serve(settings, stop, on_ready=lambda _h, p: ports.append(p)))
    try:
        while not ports:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.02)
        url = f"https://127.0.0.1:{ports[0]}"
        use_client_tls(ClientTls(str(pki.ca), str(client_files.cert), str(client_files.key)))
        async with CoordinatorClient(url, TOKEN) as client:
            assert (await client.get("/api/v1/nodes"))["nodes"] == []
        # A long-lived client (the agent's) takes a renewed client certificate.
        mine = pki.issue("client-2", ips=(), dns=())
        use_client_tls(ClientTls(str(pki.ca), str(mine.cert), str(mine.key)))
        async with CoordinatorClient(url, TOKEN) as client:
            assert (await client.get("/api/v1/nodes"))["nodes"] == []
            before = client._ssl
            renewed = pki.issue("client-2", ips=(), dns=(), days=60)
            assert renewed.cert == mine.cert
            assert (await client.get("/api/v1/nodes"))["nodes"] == []
            assert client._ssl is not before
        use_client_tls(ClientTls(str(pki.ca)))
        with pytest.raises(TlsError, match="requires a client certificate"):
            async with CoordinatorClient(url, TOKEN) as client:
                await client.get("/api/v1/nodes")
    finally:
        stop.set()
        await task


async def test_services_refuse_plaintext_on_a_non_loopback_address(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"kind: coordinator\nlisten: {{host: 0.0.0.0, port: 0}}\ndatabase: {tmp_path / 'c.db'}\n"
    )
    with pytest.raises(ConfigError, match=r"refusing to listen in plaintext on 0\.0\.0\.0") as err:
        await serve(load_settings(str(config), "coordinator"), asyncio.Event())
    assert "allow_plaintext" in str(err.value)
    config.write_text("kind: coordinator\ntls: {require_client_cert: true}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*tls\.require_client_cert"):
        load_settings(str(config), "coordinator")


def test_serve_refuses_plaintext_on_a_non_loopback_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "src").mkdir()
    code = run_cli(["serve", str(tmp_path / "src"), "--bind", "0.0.0.0:0", "--no-auth"])
    assert code == 2
    assert "refusing to listen in plaintext on 0.0.0.0" in capsys.readouterr().err


@pytest.fixture
def mutual_tls_server(
    tmp_path: Path, pki: Pki, server_files: NodeFiles
) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(3_000_000))
    (src / "sub" / "b.txt").write_bytes(b"hello\n" * 1000)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    log = tmp_path / "serve.log"
    args = [
        sys.executable, "-m", "netopt", "--log-level", "debug", "serve", str(src), "--name",
        "ds", "--bind", "127.0.0.1:0", "--token-file", str(token_file), "--threads", "2",
        "--chunk-size", "262144", "--tls-cert", str(server_files.cert),
        "--tls-key", str(server_files.key), "--tls-ca", str(pki.ca), "--require-client-cert",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert "serving netopt://127.0.0.1:" in line, log.read_text()
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        yield proc, port, log
    finally:
        proc.terminate()
        proc.wait(20)
        assert proc.stdout is not None
        proc.stdout.close()


def test_sync_over_mutual_tls_is_byte_for_byte_and_leaks_no_secret(
    tmp_path: Path,
    pki: Pki,
    client_files: NodeFiles,
    mutual_tls_server: tuple[subprocess.Popen[bytes], int, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, port, log = mutual_tls_server
    url = f"netopt://127.0.0.1:{port}/ds"
    tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(client_files.cert),
           "--tls-key", str(client_files.key)]  # fmt: skip
    code = run_cli(["sync", url, str(tmp_path / "dst"), "--cache-dir", str(tmp_path / "c"),
                    "--json", *tls])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out
    for rel in ("a.bin", "sub/b.txt"):
        assert (tmp_path / "dst" / rel).read_bytes() == (tmp_path / "src" / rel).read_bytes()
    # Without the client certificate the server refuses the handshake: a clear error, at
    # once (not retried for the retry window).
    refused = _refused_without_client_certificate(url, tmp_path / "2", pki, capsys)
    # Nothing printed or logged holds the token or a private key.
    key_lines = {
        line
        for f in (client_files.key, pki.root / "server-1-key.pem")
        for line in f.read_text().splitlines()
        if "PRIVATE KEY" not in line
    }
    for text in (out.out + out.err, refused.out + refused.err, log.read_text()):
        assert TOKEN not in text
        assert not any(line in text for line in key_lines)


def _refused_without_client_certificate(
    url: str, work: Path, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> pytest.CaptureResult[str]:
    """A sync of ``url`` with the CA but no client certificate: refused with a clear error,
    at once (not retried for the retry window); what it printed."""
    started = time.monotonic()
    code = run_cli(["sync", url, str(work / "dst"), "--cache-dir", str(work / "c"),
                    "--json", "--tls-ca", str(pki.ca)])  # fmt: skip
    refused = capsys.readouterr()
    assert code == 1
    assert "requires a client certificate" in refused.out, refused.out
    assert time.monotonic() - started < 20
    return refused


def test_doctor_reports_a_certificate_expiring_within_30_days(
    pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    soon = pki.issue("soon", days=10)
    later = pki.issue("later", days=200)
    for files, expected in ((soon, ["TLS certificate"]), (later, [])):
        code = run_cli(["doctor", "--no-mtu", "--json", "--tls-cert", str(files.cert),
                        "--tls-key", str(files.key), "--tls-ca", str(pki.ca)])  # fmt: skip
        report = json.loads(capsys.readouterr().out)
        assert code in (0, 1)  # 1: other findings of this machine
        titles = [f["title"] for f in report["findings"] if f["check"] == "tls"]
        assert [t.split(" ")[0] + " " + t.split(" ")[1] for t in titles] == expected, titles
        if expected:
            assert "expires in 10.0 days" in titles[0]
            assert str(files.cert) in titles[0]


def test_a_handshake_never_finished_is_closed_at_the_header_deadline(
    server_files: NodeFiles,
) -> None:
    limits = ListenerLimits(header_timeout_s=0.5)
    with thread_server(_context(server_files), limits) as url:  # type: ignore[arg-type]
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            started = time.monotonic()
            assert sock.recv(1) == b""  # closed by the server, not timed out here
            assert time.monotonic() - started < 10


async def test_a_renewed_certificate_is_served_without_a_restart(pki: Pki) -> None:
    from aiohttp import web
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    from netopt.config import TlsSettings
    from netopt.tlsconf import certificate_watch, client_context
    from netopt.webshell import start_site

    first = pki.issue("renewing")
    section = TlsSettings(cert=str(first.cert), key=str(first.key))
    ctx = server_context(ServerTls(str(first.cert), str(first.key)))
    runner = web.AppRunner(web.Application())
    await runner.setup()
    await start_site(runner, host="127.0.0.1", port=0, ssl_context=ctx)
    port = int(runner.addresses[0][1])
    watch = asyncio.create_task(certificate_watch(ctx, section, "test", interval_s=0.05))
    client = client_context(ClientTls(str(pki.ca)))

    async def served_der() -> bytes:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        await writer.wait_closed()
        return bytes(der)

    def der_of(path: Path) -> bytes:
        return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(Encoding.DER)

    try:
        first_der = der_of(first.cert)
        assert await served_der() == first_der
        renewed = pki.issue("renewing", days=90)  # netopt tls renew: same paths, new pair
        renewed_der = der_of(renewed.cert)
        assert renewed_der != first_der
        deadline = time.monotonic() + 10
        while await served_der() != renewed_der:
            assert time.monotonic() < deadline, "the renewed certificate was not taken"
            await asyncio.sleep(0.05)
    finally:
        watch.cancel()
        await runner.cleanup()


@pytest.mark.parametrize(
    ("listen_host", "coordinator_url", "refusal"),
    [
        ("0.0.0.0", "http://127.0.0.1:9", "refusing to listen in plaintext on 0.0.0.0"),
        ("127.0.0.1", "http://198.18.0.1:9", "refusing to send the token in plaintext"),
    ],
)
def test_the_agent_refuses_plaintext_off_the_host_before_starting(
    tmp_path: Path,
    listen_host: str,
    coordinator_url: str,
    refusal: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"kind: agent\nnode: n1\nregion: r1\ncoordinator_url: {coordinator_url}\n"
        f"listen: {{host: {listen_host}, port: 0}}\n"
        f"spool: {{dir: {tmp_path / 'spool'}}}\ncache: {{dir: {tmp_path / 'cache'}}}\n"
    )
    assert run_cli(["agent", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert refusal in err, err
    assert TOKEN not in err


CBC_ONLY = "ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384:ECDHE-ECDSA-AES128-SHA"


def _handshake(ctx: ssl.SSLContext, port: int) -> tuple[str, str]:
    """(cipher, version) of a handshake with 127.0.0.1:``port``; raises ssl.SSLError."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        name, version, _ = tls.cipher()  # type: ignore[misc]
        return name, version


def test_only_aead_suites_are_spoken_either_way(pki: Pki, server_files: NodeFiles) -> None:
    aead = {c["name"] for c in ssl.create_default_context().get_ciphers() if c["aead"]}
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(str(pki.ca))
    with thread_server(_context(server_files)) as url:  # type: ignore[arg-type]
        port = int(url.rsplit(":", 1)[1])
        # netopt's own ends: TLS 1.3 (AES-GCM), or under 1.2 an ECDHE AES-GCM suite.
        ours = client_context(ClientTls(ca_file=str(pki.ca)))
        assert _handshake(ours, port) == ("TLS_AES_256_GCM_SHA384", "TLSv1.3")
        client.maximum_version = ssl.TLSVersion.TLSv1_2
        name, version = _handshake(client, port)
        assert version == "TLSv1.2"
        assert name in aead, name
        assert name.startswith("ECDHE-ECDSA-AES"), name
        # A client that offers only CBC suites (what ssl's defaults still allow) is refused
        # (asyncio's server drops the connection on the failed handshake).
        client.set_ciphers(CBC_ONLY)
        with pytest.raises(ssl.SSLError, match=r"HANDSHAKE_FAILURE|UNEXPECTED_EOF"):
            _handshake(client, port)
    # And netopt's client refuses a server that speaks only CBC under TLS 1.2.
    weak = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    weak.maximum_version = ssl.TLSVersion.TLSv1_2
    weak.set_ciphers(CBC_ONLY)
    weak.load_cert_chain(str(server_files.cert), str(server_files.key))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        errors: list[BaseException] = []

        def accept() -> None:
            conn, _ = listener.accept()
            try:
                weak.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError) as exc:
                errors.append(exc)
            finally:
                conn.close()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        with pytest.raises(ssl.SSLError):
            _handshake(ours, listener.getsockname()[1])
        thread.join(10)
    assert errors, "the weak server saw no failed handshake"
    assert "NO_SHARED_CIPHER" in str(errors[0]), errors


def test_a_close_right_after_the_handshake_without_a_client_certificate_is_named(
    tmp_path: Path, pki: Pki, server_files: NodeFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TLS 1.3 server refusing a missing client certificate closes after the handshake,
    without its alert here: the sync names the likely cause, at once. (Whether the client
    sees the close as a disconnect or a reset depends on timing; both are read alike,
    see `test_httpsource_closed_unanswered`.)"""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server_files.cert, server_files.key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def refuse(raw: socket.socket) -> None:
        try:
            conn = context.wrap_socket(raw, server_side=True)
            conn.settimeout(5)
            conn.recv(1)  # the request has come: unread bytes make the close a reset
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
            conn.close()
        except OSError:
            raw.close()

    def serve() -> None:
        # Each connection on its own thread, as a server does: the sync's warm-up opens
        # connections that carry no request, and one must not hold the others back.
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=refuse, args=(raw,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        _refused_without_client_certificate(f"netopt://127.0.0.1:{port}/ds", tmp_path, pki, capsys)
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=10)
