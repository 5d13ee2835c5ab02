"""https: certificate verification is on by default; s3.ca_file,
$AWS_CA_BUNDLE and s3.verify_tls=false behave as documented. The server is a
small Python https endpoint on 127.0.0.1 answering a ListObjectsV2 page."""
import os
import subprocess
import sys
import time

import pytest

SERVER = r'''
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        body = (b'<?xml version="1.0" encoding="UTF-8"?>'
                b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                b'<Name>bkt</Name><Prefix></Prefix><KeyCount>1</KeyCount>'
                b'<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>'
                b'<Contents><Key>tls-ok</Key><LastModified>2026-01-01T00:00:00.000Z'
                b'</LastModified><ETag>&quot;abc&quot;</ETag><Size>7</Size>'
                b'<StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>')
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
'''


@pytest.fixture
def https_server(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1",
                    "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    p = subprocess.Popen([sys.executable, "-c", SERVER, str(cert), str(key)],
                         stdout=subprocess.PIPE)
    port = int(p.stdout.readline())
    yield f"https://127.0.0.1:{port}", cert
    p.terminate()
    p.wait(10)


def run(tool, endpoint, **env):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("AWS_", "DSTAGE_"))}
    e.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
             AWS_SECRET_ACCESS_KEY="secret", DSTAGE_S3_MAX_ATTEMPTS="2",
             DSTAGE_S3_BACKOFF_BASE="10ms")
    e.update(env)
    return subprocess.run([tool("objstore_tool"), "s3://bkt/", "ls"], env=e,
                          capture_output=True, timeout=60)


def test_self_signed_certificate_refused_by_default(tool, https_server):
    endpoint, _ = https_server
    p = run(tool, endpoint)
    assert p.returncode == 1
    err = p.stderr.decode()
    assert "certificate" in err and "EIO" in err
    assert "attempt 1 of 2" in err  # a TLS failure is not retried
    assert b"tls-ok" not in p.stdout


def test_ca_file_and_aws_ca_bundle_trust_it(tool, https_server):
    endpoint, cert = https_server
    p = run(tool, endpoint, DSTAGE_S3_CA_FILE=str(cert))
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().split("\t")[3].strip() == "tls-ok"
    p = run(tool, endpoint, AWS_CA_BUNDLE=str(cert))
    assert p.returncode == 0, p.stderr.decode()


def test_verify_tls_false_accepts_it(tool, https_server):
    endpoint, _ = https_server
    p = run(tool, endpoint, DSTAGE_S3_VERIFY_TLS="false")
    assert p.returncode == 0, p.stderr.decode()
    # ... and says what that costs, once, naming the endpoint.
    err = p.stderr.decode()
    assert err.count("s3.verify_tls = false: the certificate of %s is not "
                     "checked" % endpoint) == 1, err
    p = run(tool, endpoint, DSTAGE_S3_CA_FILE=str(https_server[1]))
    assert "verify_tls" not in p.stderr.decode()
    assert "plain http" not in p.stderr.decode()
