"""Google's OAuth2 token endpoint on 127.0.0.1, for service-account keys whose `token_uri` points here.

    with OAuthTokenServer() as oauth:
        key = oauth.new_service_account("airflow@proj.iam.gserviceaccount.com")   # key JSON (dict)
        creds = service_account.Credentials.from_service_account_info(key, scopes=[CLOUD_PLATFORM])
        oauth.authorize("Bearer ...")        # (http status, google status, message) or None if allowed

Like oauth2.googleapis.com/token it takes the JWT-bearer grant (RFC 7523) that google-auth signs
with the key: it checks the RS256 signature against the key's public half, `iss` (the account's
email), `aud` (Google's token URI, which google-auth signs whatever the key's token_uri, or this one), `iat`/`exp`
(at most an hour apart, not expired) and `scope`, then
issues an opaque access token for an hour. `authorize` is what a Google API front end does with the
Authorization header: it accepts those tokens, and also the self-signed JWTs GAPIC clients send
instead (signed by a registered key, iss == sub, with a scope or an audience), and answers 401
UNAUTHENTICATED otherwise and 403 ACCESS_TOKEN_SCOPE_INSUFFICIENT without cloud-platform.
Leniencies: keys are never rotated or revoked; IAM roles are not modelled (any registered account
may do anything); the token lifetime is not enforced on the API side.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

from peers.loopback_http import LoopbackServer

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"  # the aud google-auth signs, whatever token_uri is


def _rsa_key_pem() -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


class OAuthTokenServer(LoopbackServer):
    def __init__(self) -> None:
        self.public_keys: dict[str, str] = {}  # client_email -> PEM public key
        self.tokens: dict[str, dict] = {}  # access token -> {"email", "scope", "expires"}
        self.grants: list[str] = []  # client_email of every grant issued, in order
        self.refusals: list[str] = []  # why each refused grant was refused
        self._lock = threading.Lock()
        super().__init__(_handler(self))

    @property
    def token_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def new_service_account(self, email: str, project: str = "mlm-test-project") -> dict:
        """A fresh RSA key registered here; returns the key JSON as the IAM console downloads it."""
        private, public = _rsa_key_pem()
        self.public_keys[email] = public
        return {
            "type": "service_account",
            "project_id": project,
            "private_key_id": secrets.token_hex(20),
            "private_key": private,
            "client_email": email,
            "client_id": str(secrets.randbelow(10**20)),
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/" + email.replace("@", "%40"),
            "universe_domain": "googleapis.com",
        }

    # -- verification -----------------------------------------------------------------------------
    def _verify_jwt(self, token: str, audience: str | None) -> dict:
        """Claims of a JWT signed by a registered key; ValueError says why not."""
        from google.auth import jwt

        unverified = jwt.decode(token, verify=False)
        email = unverified.get("iss", "")
        if email not in self.public_keys:
            raise ValueError(f"unknown issuer {email!r}")
        # Checks the signature, iat/exp (with google-auth's clock skew) and, if given, aud.
        claims = jwt.decode(token, certs=self.public_keys[email], audience=audience)
        if claims["exp"] - claims["iat"] > 3600:
            raise ValueError("JWT lifetime over one hour")
        return claims

    def grant(self, form: dict[str, str]) -> tuple[int, dict]:
        if form.get("grant_type") != JWT_GRANT:
            return 400, {"error": "unsupported_grant_type", "error_description": "Invalid grant_type."}
        try:
            claims = self._verify_jwt(form.get("assertion", ""), audience=[GOOGLE_TOKEN_URI, self.token_uri])
        except Exception as err:  # any failure to verify is an invalid grant, as Google answers it
            with self._lock:
                self.refusals.append(str(err))
            return 400, {"error": "invalid_grant", "error_description": f"Invalid JWT: {err}"}
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        with self._lock:
            self.tokens[token] = {
                "email": claims["iss"],
                "scope": claims.get("scope", ""),
                "expires": time.time() + 3600,
            }
            self.grants.append(claims["iss"])
        return 200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}

    def authorize(self, header: str | None, service_audience: str | None = None) -> tuple[int, str, str] | None:
        """None when `header` carries a valid token with the cloud-platform scope; else the error."""
        denied, _ = self.check(header, service_audience)
        return denied

    def check(self, header: str | None, service_audience: str | None = None):
        """(error or None, the service account's email or None) for an Authorization header."""
        denied, info = self._check(header, service_audience)
        return denied, (info or {}).get("email")

    def _check(self, header, service_audience):
        if not header or not header.startswith("Bearer "):
            return (
                401,
                "UNAUTHENTICATED",
                (
                    "Request is missing required authentication credential. Expected "
                    "OAuth 2 access token, login cookie or other valid authentication "
                    "credential."
                ),
            ), None
        token = header[len("Bearer ") :]
        info = self.tokens.get(token)
        if info is None and token.count(".") == 2:  # a self-signed JWT (GAPIC clients' service accounts)
            try:
                claims = self._verify_jwt(token, audience=None)
                if claims.get("sub") != claims.get("iss"):
                    raise ValueError("sub differs from iss")
                if not claims.get("scope") and claims.get("aud") != service_audience:
                    raise ValueError(f"aud {claims.get('aud')!r} is not this service")
                info = {"email": claims["iss"], "scope": claims.get("scope", CLOUD_PLATFORM)}
            except Exception:  # the API says only that the credential is invalid
                info = None
        if info is None:
            return (401, "UNAUTHENTICATED", "Request had invalid authentication credentials."), None
        if CLOUD_PLATFORM not in info["scope"].split():
            return (403, "PERMISSION_DENIED", "Request had insufficient authentication scopes."), info
        return None, info


def _handler(server: OAuthTokenServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            code, payload = server.grant(form) if self.path.split("?")[0] == "/token" else (404, {"error": "not_found"})
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
