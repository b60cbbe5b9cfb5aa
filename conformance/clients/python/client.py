"""librdkafka (confluent_kafka) member of Ferry's client conformance matrix.

The Go tests in conformance/ run it with the venv's python that
conformance/clients/install.sh creates:

    produce --bootstrap B --topic T --count N [--compression C] [--transactional-id X]
    consume --bootstrap B --topic T --group G --count N [--isolation read_committed]
            [--group-protocol classic|consumer]
    produce-steady --bootstrap B --topic T --count N --duration S

Each prints one JSON line per record (see ../README.md); produce-steady
prints them for acknowledged records only, then a summary line. Diagnostics go to
stderr. Any failure exits non-zero.
"""

import argparse
import json
import secrets
import sys
import time

import confluent_kafka as ck

CONSUME_TIMEOUT_S = 60.0
DRAIN_S = 10.0  # how long consume keeps reading past --count to reach the end offsets
TXN_BATCH = 25  # records per transaction in transactional produce
STEADY_GRACE_S = 60.0  # how long produce-steady waits for acks after its last send


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


def log_errors(err):
    print(f"client.py: librdkafka error: {err}", file=sys.stderr)


def produce(a):
    conf = {
        "bootstrap.servers": a.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": a.compression,
        "linger.ms": 5,
        "batch.size": 4096,  # several batches per partition
        "delivery.timeout.ms": 60000,
        "error_cb": log_errors,
    }
    if a.transactional_id:
        conf["transactional.id"] = a.transactional_id
    p = ck.Producer(conf)
    run = secrets.token_hex(6)
    base = int(time.time() * 1000) - a.count  # explicit, distinct, in the past
    results = [None] * a.count
    failures = []

    def on_delivery(i, aborted):
        def cb(err, msg):
            if err is not None:
                failures.append(f"record {i}: {err}")
                return
            results[i] = record_json(
                msg.partition(), msg.offset(), f"k-{i}", f"v-{i}-{run}",
                {"h": str(i)}, base + i, aborted)
        return cb

    def send(i, aborted):
        while True:
            try:
                p.produce(a.topic, key=f"k-{i}", value=f"v-{i}-{run}",
                          headers=[("h", str(i).encode())], timestamp=base + i,
                          on_delivery=on_delivery(i, aborted))
                return
            except BufferError:
                p.poll(0.05)

    if a.transactional_id:
        p.init_transactions(30)
        for n, start in enumerate(range(0, a.count, TXN_BATCH)):
            # Odd-numbered transactions are aborted: half committed, a marked set aborted.
            abort = n % 2 == 1
            p.begin_transaction()
            for i in range(start, min(a.count, start + TXN_BATCH)):
                send(i, abort)
            p.flush(60)  # offsets are needed even for aborted records
            if abort:
                p.abort_transaction(30)
            else:
                p.commit_transaction(30)
    else:
        for i in range(a.count):
            send(i, False)
            p.poll(0)
    left = p.flush(60)
    if failures or left:
        sys.exit(f"produce: {left} undelivered, failures: {failures[:5]}")
    sys.stdout.write("".join(r + "\n" for r in results))


def produce_steady(a):
    """Produces --count records spread evenly over --duration seconds with an
    idempotent acks=all producer at librdkafka's default retries and delivery
    timeout, as an application would have it. A failed record is counted,
    never fatal. Prints a line per acknowledged record, then
    {"acked":a,"failed":f,"first_error":"..."}."""
    p = ck.Producer({
        "bootstrap.servers": a.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "error_cb": log_errors,
    })
    run = secrets.token_hex(6)
    base = int(time.time() * 1000) - a.count  # explicit, distinct, in the past
    results = [None] * a.count
    first_error = []

    def on_delivery(i):
        def cb(err, msg):
            if err is not None:
                if not first_error:
                    first_error.append(str(err))
                return
            results[i] = record_json(
                msg.partition(), msg.offset(), f"k-{i}", f"v-{i}-{run}",
                {"h": str(i)}, base + i)
        return cb

    start = time.monotonic()
    for i in range(a.count):
        due = start + a.duration * i / a.count
        while True:
            left = due - time.monotonic()
            if left <= 0:
                break
            p.poll(left)
        while True:
            try:
                p.produce(a.topic, key=f"k-{i}", value=f"v-{i}-{run}",
                          headers=[("h", str(i).encode())], timestamp=base + i,
                          on_delivery=on_delivery(i))
                break
            except BufferError:
                p.poll(0.05)
            except ck.KafkaException as e:
                if not first_error:
                    first_error.append(str(e))
                break
        p.poll(0)
    if p.flush(STEADY_GRACE_S) and not first_error:
        first_error.append(f"unacknowledged {STEADY_GRACE_S:.0f} s after the last send")
    acked = [r for r in results if r is not None]
    sys.stdout.write("".join(r + "\n" for r in acked))
    sys.stdout.write(json.dumps({
        "acked": len(acked),
        "failed": a.count - len(acked),
        "first_error": first_error[0] if first_error else "",
    }) + "\n")
    sys.stdout.flush()
    p.purge()  # do not let exit wait for what is left
    p.poll(0)


def consume(a):
    conf = {
        "bootstrap.servers": a.bootstrap,
        "group.id": a.group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": a.isolation,
        "error_cb": log_errors,
    }
    if a.group_protocol != "classic":
        # Only set when needed: librdkafka before 2.4 has no such property.
        conf["group.protocol"] = a.group_protocol
    c = ck.Consumer(conf)
    c.subscribe([a.topic])
    out = []
    deadline = time.monotonic() + CONSUME_TIMEOUT_S

    def poll():
        msg = c.poll(0.2)
        if msg is None:
            return
        if msg.error():
            if msg.error().code() == ck.KafkaError._PARTITION_EOF:
                return
            raise ck.KafkaException(msg.error())
        headers = {k: (v.decode() if v is not None else None) for k, v in (msg.headers() or [])}
        out.append(record_json(
            msg.partition(), msg.offset(),
            msg.key().decode() if msg.key() is not None else None,
            msg.value().decode() if msg.value() is not None else None,
            headers, msg.timestamp()[1]))

    while len(out) < a.count and time.monotonic() < deadline:
        poll()

    # Drain to the end offsets (last stable offsets under read_committed), so
    # extra records show up and committed positions step over trailing
    # aborted records and transaction markers.
    def caught_up():
        for tp in c.position(c.assignment()):
            _, high = c.get_watermark_offsets(tp, timeout=10, cached=False)
            if tp.offset < high:
                return False
        return True

    drain_until = min(deadline, time.monotonic() + DRAIN_S)
    while time.monotonic() < drain_until and not caught_up():
        poll()
    if len(out) < a.count:
        print(f"consume: timed out with {len(out)} of {a.count} records", file=sys.stderr)
    # Commit every assigned partition's position (the next offset to read).
    positions = [tp for tp in c.position(c.assignment()) if tp.offset >= 0]
    if positions:
        c.commit(offsets=positions, asynchronous=False)
    c.close()
    sys.stdout.write("".join(r + "\n" for r in out))


def main():
    ap = argparse.ArgumentParser(prog="client.py")
    ap.add_argument("mode", choices=["produce", "consume", "produce-steady"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--compression", default="none",
                    choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--transactional-id")
    ap.add_argument("--duration", type=float, default=0.0)
    ap.add_argument("--group")
    ap.add_argument("--isolation", default="read_uncommitted",
                    choices=["read_uncommitted", "read_committed"])
    ap.add_argument("--group-protocol", default="classic", choices=["classic", "consumer"])
    a = ap.parse_args()
    if a.mode == "produce":
        produce(a)
    elif a.mode == "produce-steady":
        produce_steady(a)
    else:
        if not a.group:
            ap.error("consume needs --group")
        consume(a)


if __name__ == "__main__":
    main()
