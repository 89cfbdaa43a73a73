#!/usr/bin/env python3
"""A small registry token server, as every public registry has one (Docker's token spec).

Beside a CNCF distribution registry configured with
`auth: {token: {realm, service, issuer, rootcertbundle: CERT}}` it grants RS256 JWTs signed
by KEY, with CERT in the header's `x5c`, and the actions each `scope` asks for.

  GET  /token?service=S&scope=repository:R:pull,push&scope=…   (Docker clients; basic auth)
  POST /token  grant_type=password|refresh_token, service, scope (OAuth: BuildKit, containerd)

With --user/--password, requests without those credentials (or the refresh token this
server handed out) get 401. Every token request is appended to --log as one JSON line
({"method", "scopes", "status"}), so tests and the bench count fetches. The port it
listens on (127.0.0.1, chosen by the kernel) is printed as the first line of stdout.
"""
import argparse
import base64
import json
import secrets
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def parse_scope(scope):
    """`TYPE:NAME:ACTIONS` (`repository:a/b:pull,push`) as a claim's access entry."""
    parts = scope.split(":")
    if len(parts) < 3:
        return None
    kind, name, actions = parts[0], ":".join(parts[1:-1]), parts[-1]
    return {"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]}


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, args):
        super().__init__(("127.0.0.1", 0), Handler)
        self.args = args
        with open(args.key, "rb") as f:
            self.key = serialization.load_pem_private_key(f.read(), password=None)
        with open(args.cert, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        self.x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self.refresh_tokens = set()
        self.lock = threading.Lock()

    def token(self, subject, scopes):
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        claims = {
            "iss": self.args.issuer,
            "sub": subject,
            "aud": self.args.service,
            "exp": now + self.args.expires_in,
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(16),
            "access": [s for s in (parse_scope(x) for x in scopes) if s],
        }
        signing_input = (
            b64url(json.dumps(header, separators=(",", ":")).encode())
            + "."
            + b64url(json.dumps(claims, separators=(",", ":")).encode())
        )
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return signing_input + "." + b64url(signature)

    def record(self, method, scopes, status):
        line = json.dumps({"method": method, "scopes": scopes, "status": status})
        with self.lock, open(self.args.log, "a") as f:
            f.write(line + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="polyarch-test-token"')
        self.end_headers()
        self.wfile.write(data)

    def allowed(self, user, password, refresh):
        args = self.server.args
        if args.user is None:
            return True
        if refresh is not None:
            return refresh in self.server.refresh_tokens
        return user == args.user and password == args.password

    def grant(self, method, params, user, password, refresh=None, offline=False):
        scopes = []
        for value in params.get("scope", []):
            scopes.extend(value.split(" "))
        if not self.allowed(user, password, refresh):
            self.server.record(method, scopes, 401)
            return self.answer(401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]})
        token = self.server.token(user or "anonymous", scopes)
        body = {
            "token": token,
            "access_token": token,
            "expires_in": self.server.args.expires_in,
            "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if offline:
            fresh = secrets.token_hex(16)
            self.server.refresh_tokens.add(fresh)
            body["refresh_token"] = fresh
        self.server.record(method, scopes, 200)
        self.answer(200, body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/token":
            return self.answer(404, {})
        params = urllib.parse.parse_qs(url.query)
        user = password = None
        header = self.headers.get("Authorization", "")
        if header.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except ValueError:
                pass
        self.grant("GET", params, user, password)

    def do_POST(self):
        if urllib.parse.urlsplit(self.path).path != "/token":
            return self.answer(404, {})
        length = int(self.headers.get("Content-Length", "0"))
        params = urllib.parse.parse_qs(self.rfile.read(length).decode())
        one = lambda k: params.get(k, [None])[0]
        grant_type = one("grant_type")
        if grant_type == "password":
            self.grant("POST", params, one("username"), one("password"),
                       offline=one("access_type") == "offline")
        elif grant_type == "refresh_token":
            self.grant("POST", params, None, None, refresh=one("refresh_token"))
        else:
            self.answer(400, {"error": "unsupported_grant_type"})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--key", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--issuer", default="polyarch-test-issuer")
    p.add_argument("--service", default="polyarch-test-registry")
    p.add_argument("--log", required=True)
    p.add_argument("--user")
    p.add_argument("--password")
    p.add_argument("--expires-in", type=int, default=300)
    args = p.parse_args()
    server = Server(args)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
