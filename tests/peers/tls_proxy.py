"""Point TensorFlow's own gs:// filesystem at the GCS emulator: a TLS-terminating CONNECT proxy.

TensorFlow's C++ GCS client has no emulator switch: it always calls
https://www.googleapis.com/{storage,upload/storage}/v1/... (metadata, listing, uploads) and
https://storage.googleapis.com/<bucket>/<object> with a Range header (reads). It does honour
libcurl's HTTPS_PROXY and TensorFlow's CURL_CA_BUNDLE, so this proxy accepts
`CONNECT <google host>:443`, terminates TLS with a certificate for that host signed by a CA made
for the test session, and forwards the plain HTTP requests to the emulator, which serves those
same paths. Auth: GOOGLE_AUTH_TOKEN_FOR_TESTING gives TF a fixed bearer token (the emulator
ignores it) and NO_GCE_CHECK=true stops it probing the metadata server; the proxy refuses any
other host, so a request we did not plan for fails loudly instead of reaching out.

Fixture `tf_gcs_env` (session) yields the environment for a TensorFlow SUBPROCESS: TF reads
these variables when its gs:// filesystem first loads, so set them before `import tensorflow`.
"""

from __future__ import annotations

import datetime as dt
import http.client
import socketserver
import ssl
import threading
from pathlib import Path

import pytest

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com")
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "content-length",
}


def make_certs(out_dir: Path, hosts=GOOGLE_HOSTS) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for `hosts`; returns (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mlm test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = out_dir / "ca.pem", out_dir / "cert.pem", out_dir / "key.pem"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem))
    paths[2].write_bytes(leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


def _read_head(f) -> tuple[str, list[tuple[str, str]]] | None:
    line = f.readline(65537)
    if not line.strip():
        return None
    headers = []
    while True:
        h = f.readline(65537)
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return line.decode("latin-1").strip(), headers


def _read_body(f, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(f.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while f.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(f.read(size))
            f.readline()
    return f.read(int(headers.get("content-length", "0")))


class _Handler(socketserver.StreamRequestHandler):
    server: _ProxyServer

    def handle(self) -> None:
        head = _read_head(self.rfile)
        if head is None:
            return
        method, target, _ = head[0].split(" ", 2)
        host, _, port = target.partition(":")
        if method != "CONNECT" or host not in GOOGLE_HOSTS or port != "443":
            self.server.refused.append(head[0])
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        with self.server.tls.wrap_socket(self.connection, server_side=True) as tls:
            rfile, wfile = tls.makefile("rb"), tls.makefile("wb")
            while self._one_request(host, rfile, wfile):
                pass

    def _one_request(self, host: str, rfile, wfile) -> bool:
        head = _read_head(rfile)
        if head is None:
            return False
        method, path, _ = head[0].split(" ", 2)
        headers = dict((k.lower(), v) for k, v in head[1])
        if headers.get("expect", "").lower() == "100-continue":
            wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            wfile.flush()
        body = _read_body(rfile, headers)
        if host == "oauth2.googleapis.com":
            status, reason = 200, "OK"
            out_headers, out = (
                [("Content-Type", "application/json")],
                (b'{"access_token": "fake-token", "expires_in": 3600, "token_type": "Bearer"}'),
            )
        else:
            status, reason, out_headers, out = self._forward(method, path, head[1], body)
        self.server.log.append((method, host, path, status, headers.get("range", "")))
        lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in out_headers]
        lines.append(f"Content-Length: {len(out)}")
        wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + out)
        wfile.flush()
        return headers.get("connection", "").lower() != "close"

    def _forward(self, method, path, headers, body):
        # Host stays the Google one, so URLs the emulator builds from it (resumable upload
        # sessions) point back through this proxy; only their scheme needs fixing.
        fwd = {k: v for k, v in headers if k.lower() not in HOP_BY_HOP}
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            conn.request(method, path, body=body if body or method in ("POST", "PUT") else None, headers=fwd)
            resp = conn.getresponse()
            out = resp.read()
        finally:
            conn.close()
        out_headers = []
        for k, v in resp.getheaders():
            if k.lower() in HOP_BY_HOP:
                continue
            if k.lower() == "location" and v.startswith("http://"):
                v = "https://" + v[len("http://") :]
            out_headers.append((k, v))
        return resp.status, resp.reason, out_headers, b"" if method == "HEAD" else out


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: tuple[str, int], tls: ssl.SSLContext):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream, self.tls = upstream, tls
        self.log: list[tuple[str, str, str, int, str]] = []  # (method, host, path, status, range)
        self.refused: list[str] = []


class TlsGcsProxy:
    """Run with `with TlsGcsProxy(("127.0.0.1", port), workdir) as proxy: proxy.env()`."""

    def __init__(self, upstream: tuple[str, int], workdir: Path):
        self.ca, cert, key = make_certs(workdir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server = _ProxyServer(upstream, ctx)
        self.workdir = workdir
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def env(self) -> dict[str, str]:
        gcloud_dir = self.workdir / "gcloud"  # empty: no developer credentials leak into tests
        gcloud_dir.mkdir(exist_ok=True)
        return {
            "HTTPS_PROXY": self.url,
            "https_proxy": self.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "CURL_CA_BUNDLE": str(self.ca),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake-token",
            "NO_GCE_CHECK": "true",
            "CLOUDSDK_CONFIG": str(gcloud_dir),
            # Fail in seconds, not minutes, when something is wrong.
            "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
            "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
        }

    def __enter__(self) -> TlsGcsProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="session")
def tls_gcs_proxy(gcs, tmp_path_factory):
    with TlsGcsProxy((gcs.host, gcs.port), tmp_path_factory.mktemp("tls-proxy")) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def tf_gcs_env(gcs, tls_gcs_proxy) -> dict[str, str]:
    """Env for a TensorFlow subprocess whose gs:// reads and writes land in the emulator; it also
    carries STORAGE_EMULATOR_HOST so mlm_tasks.storage in that process uses the same bucket."""
    return {
        **tls_gcs_proxy.env(),
        "STORAGE_EMULATOR_HOST": gcs.endpoint,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "TF_USE_LEGACY_KERAS": "1",
    }
