"""What the Python programs of Ferry's client conformance matrix share
(python/client.py on confluent-kafka, kafka-python/client.py): the command
line, the JSON lines they print (README.md here), the security settings the
tests pass in the environment, and the stream mode's threads. Each program
brings its library's side: the modes, the stream roles, how it reports an
error, and its library's names for the security settings.

The programs run under three interpreters (two venvs and Debian's python3),
so this file is found next to them, not installed: each puts this directory
on sys.path before importing it."""

import argparse
import json
import os
import sys
import threading
import time

CONSUME_TIMEOUT_S = 60.0
DRAIN_S = 10.0  # how long consume keeps reading past --count to reach the end offsets
TXN_BATCH = 25  # records per transaction in transactional produce
STEADY_GRACE_S = 60.0  # how long produce-steady waits for acks after its last send

TXN_RECORDS = 10  # records per transaction in stream's txn role
TXN_ABORT_EVERY = 4  # every 4th transaction is aborted on purpose
TXN_PAUSE_S = 0.1  # pause between transactions


def record_json(partition, offset, key, value, headers, timestamp, aborted=False):
    m = {
        "partition": partition,
        "offset": offset,
        "key": key,
        "value": value,
        "headers": headers,
        "timestamp": timestamp,
    }
    if aborted:
        m["aborted"] = True
    return json.dumps(m, separators=(",", ":"))


def security(names):
    """The client-side security settings the tests pass in the environment
    (README.md here, "Security"), under the names the library gives them
    (names maps protocol, ca, mechanism, username and password to them):
    none when CONFORMANCE_SECURITY_PROTOCOL is unset."""
    proto = os.environ.get("CONFORMANCE_SECURITY_PROTOCOL", "")
    if not proto:
        return {}
    conf = {names["protocol"]: proto}
    if os.environ.get("CONFORMANCE_SSL_CA_FILE"):
        conf[names["ca"]] = os.environ["CONFORMANCE_SSL_CA_FILE"]
    if os.environ.get("CONFORMANCE_SASL_MECHANISM"):
        conf[names["mechanism"]] = os.environ["CONFORMANCE_SASL_MECHANISM"]
        conf[names["username"]] = os.environ["CONFORMANCE_SASL_USERNAME"]
        conf[names["password"]] = os.environ["CONFORMANCE_SASL_PASSWORD"]
    return conf


_out_lock = threading.Lock()


def emit(m):
    line = json.dumps(m, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)


def ev(role, kind, **kw):
    m = {"role": role, "ev": kind}
    m.update(kw)
    return m


def stream(a, roles, emit_error, group_protocols):
    """Runs the roles asked for, each on its own thread, until stopped: a
    stdin line "stop ROLE" stops one, the end of stdin every one left. Each
    prints one JSON line per event (README.md here). roles maps "produce",
    "txn" and "consume" to the program's role functions, called with the
    arguments, the role's spec and its stop event."""
    run = []
    if a.produce:
        run.append(("produce", roles["produce"], a.produce))
    if a.txn:
        run.append(("txn", roles["txn"], a.txn))
    for spec in a.consume or []:
        f = spec.split(":")
        if len(f) != 5:
            sys.exit(f"--consume NAME:TOPIC:GROUP:PROTOCOL:ISOLATION, got {spec}")
        if f[3] not in group_protocols:
            sys.exit(f"--consume {spec}: no {f[3]} group protocol here; only {', '.join(group_protocols)}")
        run.append((f[0], roles["consume"], spec))
    stops = {name: threading.Event() for name, _, _ in run}

    def control():
        for line in sys.stdin:
            w = line.split()
            if len(w) == 2 and w[0] == "stop" and w[1] in stops:
                stops[w[1]].set()
        for s in stops.values():
            s.set()

    def flusher():
        while True:
            time.sleep(0.05)
            with _out_lock:
                sys.stdout.flush()

    def body(name, f, spec):
        try:
            f(a, spec, stops[name])
        except Exception as e:  # noqa: BLE001 — whatever ends a role is reported
            emit_error(name, e, True)
        emit(ev(name, "done"))

    threading.Thread(target=control, daemon=True).start()
    threading.Thread(target=flusher, daemon=True).start()
    threads = [threading.Thread(target=body, args=r) for r in run]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with _out_lock:
        sys.stdout.flush()
    os._exit(0)


def main(modes, roles, emit_error, group_protocols=("classic", "consumer")):
    """Parses the command line (README.md here) and runs its mode: modes maps
    "produce", "produce-steady" and "consume" to the program's functions;
    stream runs roles (see stream). group_protocols are the consumer group
    protocols the library speaks; --group-protocol takes no other."""
    ap = argparse.ArgumentParser(prog="client.py")
    ap.add_argument("mode", choices=["produce", "consume", "produce-steady", "stream"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic")
    ap.add_argument("--count", type=int)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--produce")
    ap.add_argument("--txn")
    ap.add_argument("--consume", action="append")
    ap.add_argument("--compression", default="none",
                    choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--transactional-id")
    ap.add_argument("--duration", type=float, default=0.0)
    ap.add_argument("--group")
    ap.add_argument("--isolation", default="read_uncommitted",
                    choices=["read_uncommitted", "read_committed"])
    ap.add_argument("--group-protocol", default="classic", choices=list(group_protocols))
    a = ap.parse_args()
    if a.mode == "stream":
        stream(a, roles, emit_error, group_protocols)
        return
    if a.topic is None or a.count is None:
        ap.error(f"{a.mode} needs --topic and --count")
    if a.mode == "consume" and not a.group:
        ap.error("consume needs --group")
    modes[a.mode](a)
