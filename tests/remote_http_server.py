#!/usr/bin/env python3
"""A local HTTP server for the remote-storage tests (tests/remote_test.cc).

Serves --root: GET/HEAD with Range, PUT (checks Content-MD5 when sent), DELETE,
and enough of S3's multipart upload (POST ?uploads=, PUT ?partNumber=&uploadId=,
POST ?uploadId=, DELETE ?uploadId=, GET /BUCKET?uploads=) to test that a failed
upload is aborted. With --auth KEY:SECRET every request must carry a valid AWS
SigV4 signature, checked with botocore (403 SignatureDoesNotMatch otherwise).

Control (never faulted, never signed):
  POST /_fault  {"path": "/f.bin", "fault": NAME, "count": N, "query": "partNumber=2", "method": "PUT"}
      the next N requests (-1: all) to PATH (whose query contains QUERY; of METHOD, when
      given) get FAULT:
      500, 503 (S3 SlowDown), 429, 404, 403, reset (connection reset mid body),
      truncate (correct Content-Length, half the body, close), longlength
      (Content-Length larger than the body, close), shortlength (Content-Length
      smaller than the range asked for), stall (half the body, then silence),
      latency (the answer as usual, --latency-seconds later: a store far away),
      flip (the right length, one byte in the middle of the body inverted),
      answer (200 with the fault's "body" as XML, for any method: a store's odd answer;
      "{n}" in it becomes how many times this fault has answered).
  POST /_clear  drops every fault and counter.
  GET  /_stats  {"connections": N, "requests": {path: n}, "uploads": [ids], "aborted": [ids],
                 "max_in_flight": most GET/HEAD requests answered at once}
The port is written to --port-file once the server listens.
"""
import argparse
import base64
import errno
import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import struct
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit, unquote

STATE_LOCK = threading.Lock()
FAULTS = []          # dicts: path, fault, count, query
STATS = {"connections": 0, "requests": {}, "uploads": {}, "aborted": [], "in_flight": 0, "max_in_flight": 0}
ARGS = None


def write_object(full, pieces):
    """An object appears whole or not at all, as on S3: written beside its name, then
    renamed. pieces: bytes, or paths of part files (copied in the kernel, off the GIL)."""
    os.makedirs(os.path.dirname(full), exist_ok=True)
    tmp = "%s.put-%s" % (full, uuid.uuid4().hex)
    try:
        with open(tmp, "wb") as out:
            for p in pieces:
                if isinstance(p, (bytes, bytearray)):
                    out.write(p)
                    continue
                out.flush()
                with open(p, "rb") as src:
                    size = left = os.fstat(src.fileno()).st_size
                    try:
                        while left > 0:
                            n = os.copy_file_range(src.fileno(), out.fileno(), left)
                            if n <= 0:
                                raise OSError("short copy of %s" % p)
                            left -= n
                    except OSError as e:  # a kernel or file system without it: copy here
                        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                            raise
                        src.seek(size - left)
                        out.seek(0, os.SEEK_END)
                        shutil.copyfileobj(src, out, 1 << 20)
        os.replace(tmp, full)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def s3_error(code, message):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message></Error>'
            % (code, message)).encode()


def verify_sigv4(handler):
    """True when the request's SigV4 signature is right for --auth (checked with botocore)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    key, secret = ARGS.auth.split(":", 1)
    m = re.match(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, "
                 r"SignedHeaders=([^,]+), Signature=([0-9a-f]+)$", handler.headers.get("Authorization", ""))
    if not m or m.group(1) != key:
        return False
    _, _, region, signed, signature = m.groups()
    headers = {}
    for h in signed.split(";"):
        if handler.headers.get(h) is None:
            return False
        headers[h] = handler.headers.get(h)
    if "x-amz-content-sha256" not in headers:
        return False
    req = AWSRequest(method=handler.command, url="http://%s%s" % (headers.get("host", ""), handler.path),
                     headers=headers)
    req.context["timestamp"] = headers.get("x-amz-date", "")
    signer = S3SigV4Auth(Credentials(key, secret), "s3", region)
    expected = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
    return hmac.compare_digest(expected, signature)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body go out in two writes: without this, Nagle and the client's
        # delayed ACK cost 40 ms per response.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with STATE_LOCK:
            STATS["connections"] += 1

    def log_message(self, fmt, *args):  # quiet
        pass

    # -- helpers -----------------------------------------------------------
    def send_bytes(self, code, body, headers=(), content_type="application/octet-stream"):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def read_body(self):
        n = int(self.headers.get("Content-Length", "0"))
        return self.rfile.read(n) if n else b""

    def local_path(self, path):
        rel = unquote(path).lstrip("/")
        full = os.path.realpath(os.path.join(ARGS.root, rel))
        if not full.startswith(os.path.realpath(ARGS.root)):
            return None
        return full

    def take_fault(self, path, query):
        with STATE_LOCK:
            STATS["requests"][path] = STATS["requests"].get(path, 0) + 1
            for f in FAULTS:
                if (f["path"] == path and f.get("query", "") in query and f["count"] != 0 and
                        f.get("method", self.command) == self.command):
                    if f["count"] > 0:
                        f["count"] -= 1
                    f["served"] = f.get("served", 0) + 1
                    self.fault_body = f.get("body", "").replace("{n}", str(f["served"])).encode()
                    return f["fault"]
        return None

    def hard_close(self):
        # RST instead of FIN: SO_LINGER with a zero timeout.
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close_connection = True
        try:
            self.connection.close()
        except OSError:
            pass

    # -- faults --------------------------------------------------------------
    def serve_fault(self, fault, body, start, end, size, range_start=None):
        if fault == "answer":
            return self.send_bytes(200, self.fault_body, content_type="application/xml")
        part = body[start:end + 1]
        if range_start is not None:
            start, end = range_start, range_start + len(part) - 1
        if fault in ("500",):
            return self.send_bytes(500, s3_error("InternalError", "injected"), content_type="application/xml")
        if fault == "503":
            return self.send_bytes(503, s3_error("SlowDown", "Please reduce your request rate."),
                                   [("Retry-After", "0")], "application/xml")
        if fault == "429":
            return self.send_bytes(429, s3_error("TooManyRequests", "injected"), content_type="application/xml")
        if fault == "404":
            return self.send_bytes(404, s3_error("NoSuchKey", "The specified key does not exist."),
                                   content_type="application/xml")
        if fault == "403":
            return self.send_bytes(403, s3_error("AccessDenied", "Access Denied"), content_type="application/xml")
        code = 206 if self.headers.get("Range") else 200
        self.send_response(code)
        if code == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        if fault == "flip":  # the right length, one byte wrong
            data = bytearray(part)
            if data:
                data[len(data) // 2] ^= 0xFF
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if fault == "shortlength":
            n = max(0, len(part) - 7)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            self.wfile.write(part[:n])
            return
        if fault == "longlength":
            self.send_header("Content-Length", str(len(part) + 100))
            self.end_headers()
            self.wfile.write(part)
            self.wfile.flush()
            self.close_connection = True
            return
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part[:len(part) // 2])
        self.wfile.flush()
        if fault == "reset":
            time.sleep(0.05)
            return self.hard_close()
        if fault == "truncate":
            self.close_connection = True
            return
        if fault == "stall":
            time.sleep(ARGS.stall_seconds)
            self.close_connection = True
            return
        raise ValueError("unknown fault " + fault)

    # -- control ---------------------------------------------------------------
    def control(self):
        if self.path == "/_fault":
            f = json.loads(self.read_body())
            f.setdefault("count", -1)
            with STATE_LOCK:
                FAULTS.append(f)
            return self.send_bytes(200, b"{}", content_type="application/json")
        if self.path == "/_clear":
            self.read_body()
            with STATE_LOCK:
                FAULTS.clear()
                STATS["requests"].clear()
                STATS["connections"] = 0
                STATS["max_in_flight"] = 0
            return self.send_bytes(200, b"{}", content_type="application/json")
        if self.path == "/_stats":
            with STATE_LOCK:
                out = {"connections": STATS["connections"], "requests": STATS["requests"],
                       "uploads": sorted(STATS["uploads"]), "aborted": STATS["aborted"],
                       "max_in_flight": STATS["max_in_flight"]}
            return self.send_bytes(200, json.dumps(out).encode(), content_type="application/json")
        return self.send_bytes(404, b"no such control")

    # -- methods ---------------------------------------------------------------
    def begin(self):
        """Returns (path, query) or None when the request was answered (control, auth)."""
        parts = urlsplit(self.path)
        if parts.path.startswith("/_"):
            self.control()
            return None
        if ARGS.auth and not verify_sigv4(self):
            self.read_body() if self.command in ("PUT", "POST") else None
            self.send_bytes(403, s3_error("SignatureDoesNotMatch",
                                          "The request signature we calculated does not match the signature "
                                          "you provided."), content_type="application/xml")
            return None
        return parts.path, parts.query

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        r = self.begin()
        if r is None:
            return
        with STATE_LOCK:
            STATS["in_flight"] += 1
            STATS["max_in_flight"] = max(STATS["max_in_flight"], STATS["in_flight"])
        try:
            self.serve_get(*r)
        finally:
            with STATE_LOCK:
                STATS["in_flight"] -= 1

    def serve_get(self, path, query):
        fault = self.take_fault(path, query)
        if fault == "latency":
            time.sleep(ARGS.latency_seconds)
            fault = None
        if fault == "answer":
            return self.serve_fault(fault, b"", 0, -1, 0)
        if "uploads" in query.split("&") or "uploads=" in query:
            with STATE_LOCK:
                ids = "".join("<Upload><Key>%s</Key><UploadId>%s</UploadId></Upload>" % (k, i)
                              for i, k in STATS["uploads"].items())
            return self.send_bytes(200, ("<ListMultipartUploadsResult>%s</ListMultipartUploadsResult>"
                                         % ids).encode(), content_type="application/xml")
        full = self.local_path(path)
        if full is None or not os.path.isfile(full):
            if fault in (None, "404"):
                return self.send_bytes(404, s3_error("NoSuchKey", "The specified key does not exist."),
                                       content_type="application/xml")
        exists = bool(full) and os.path.isfile(full)
        size = os.path.getsize(full) if exists else 0
        start, end = 0, size - 1
        rng = self.headers.get("Range")
        if rng:
            m = re.match(r"bytes=(\d+)-(\d*)$", rng)
            if not m:
                return self.send_bytes(416, b"bad range")
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            if start >= size:
                return self.send_bytes(416, b"", [("Content-Range", "bytes */%d" % size)])
        part = b""
        if exists:
            with open(full, "rb") as f:  # only the bytes asked for
                f.seek(start)
                part = f.read(end + 1 - start)
        # serve_fault slices body[start:end + 1]: hand it the part at its offset.
        if fault:
            return self.serve_fault(fault, part, 0, len(part) - 1, size, start)
        etag = '"%x-%x"' % (size, int(os.path.getmtime(full) * 1e6)) if exists else '""'
        if rng:
            return self.send_bytes(206, part,
                                   [("Content-Range", "bytes %d-%d/%d" % (start, end, size)), ("ETag", etag),
                                    ("Accept-Ranges", "bytes")])
        return self.send_bytes(200, part, [("ETag", etag), ("Accept-Ranges", "bytes")])

    def do_PUT(self):
        r = self.begin()
        if r is None:
            return
        path, query = r
        fault = self.take_fault(path, query)
        body = self.read_body()
        if fault:
            return self.serve_fault(fault, b"", 0, -1, 0)
        digest = hashlib.md5(body).digest()  # once: the Content-MD5 check and the ETag
        md5 = self.headers.get("Content-MD5")
        if md5 and base64.b64decode(md5) != digest:
            return self.send_bytes(400, s3_error("BadDigest", "The Content-MD5 you specified did not match."),
                                   content_type="application/xml")
        etag = [("ETag", '"%s"' % digest.hex())]
        q = dict(p.partition("=")[::2] for p in query.split("&") if p)
        if "uploadId" in q:
            with STATE_LOCK:
                if q["uploadId"] not in STATS["uploads"]:
                    return self.send_bytes(404, s3_error("NoSuchUpload", "no such upload"),
                                           content_type="application/xml")
            part = os.path.join(ARGS.root, ".parts", q["uploadId"], "%05d" % int(q["partNumber"]))
            os.makedirs(os.path.dirname(part), exist_ok=True)
            with open(part, "wb") as f:
                f.write(body)
            return self.send_bytes(200, b"", etag)
        write_object(self.local_path(path), [body])
        return self.send_bytes(200, b"", etag)

    def do_POST(self):
        r = self.begin()
        if r is None:
            return
        path, query = r
        fault = self.take_fault(path, query)
        body = self.read_body()
        if fault:
            return self.serve_fault(fault, b"", 0, -1, 0)
        q = dict(p.partition("=")[::2] for p in query.split("&") if p)
        if "uploads" in q:
            upload_id = uuid.uuid4().hex
            with STATE_LOCK:
                STATS["uploads"][upload_id] = path
            return self.send_bytes(200, ("<InitiateMultipartUploadResult><UploadId>%s</UploadId>"
                                         "</InitiateMultipartUploadResult>" % upload_id).encode(),
                                   content_type="application/xml")
        if "uploadId" in q:
            upload_id = q["uploadId"]
            with STATE_LOCK:
                known = STATS["uploads"].pop(upload_id, None)
            if known is None:
                return self.send_bytes(404, s3_error("NoSuchUpload", "no such upload"), content_type="application/xml")
            numbers = [int(n) for n in re.findall(rb"<PartNumber>(\d+)</PartNumber>", body)]
            pdir = os.path.join(ARGS.root, ".parts", upload_id)
            write_object(self.local_path(path), [os.path.join(pdir, "%05d" % n) for n in numbers])
            shutil.rmtree(pdir, ignore_errors=True)  # as S3: the parts are gone once completed
            return self.send_bytes(200, b"<CompleteMultipartUploadResult></CompleteMultipartUploadResult>",
                                   content_type="application/xml")
        return self.send_bytes(400, s3_error("InvalidRequest", "unsupported POST"), content_type="application/xml")

    def do_DELETE(self):
        r = self.begin()
        if r is None:
            return
        path, query = r
        fault = self.take_fault(path, query)
        if fault:
            return self.serve_fault(fault, b"", 0, -1, 0)
        q = dict(p.partition("=")[::2] for p in query.split("&") if p)
        if "uploadId" in q:
            with STATE_LOCK:
                gone = STATS["uploads"].pop(q["uploadId"], None)
                if gone is not None:
                    STATS["aborted"].append(q["uploadId"])
            if gone is None:
                return self.send_bytes(404, s3_error("NoSuchUpload", "no such upload"), content_type="application/xml")
            shutil.rmtree(os.path.join(ARGS.root, ".parts", q["uploadId"]), ignore_errors=True)
            return self.send_bytes(204, b"")
        full = self.local_path(path)
        if full and os.path.isfile(full):
            os.unlink(full)
        return self.send_bytes(204, b"")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--auth", default="", help="KEY:SECRET; requires SigV4 signatures")
    ap.add_argument("--stall-seconds", type=float, default=60)
    ap.add_argument("--latency-seconds", type=float, default=0.2)
    ARGS = ap.parse_args()
    parent = os.getppid()

    def watch_parent():  # exit with the test that started us
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128  # (the default, 5, drops connections made at once: a second's retry)

    server = Server(("127.0.0.1", 0), Handler)
    tmp = ARGS.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, ARGS.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
