"""kafka-python member of Ferry's client conformance matrix: a pure-Python
client (no librdkafka), run with the venv's python that
conformance/clients/install.sh creates from requirements.txt here:

    produce --bootstrap B --topic T --count N [--compression C] [--transactional-id X]
    consume --bootstrap B --topic T --group G --count N [--isolation read_committed]
            [--group-protocol classic]
    produce-steady --bootstrap B --topic T --count N --duration S
    stream --bootstrap B --partitions P --rate R [--produce T] [--txn T:ID]
           [--consume NAME:T:GROUP:classic:ISOLATION]...

Each prints one JSON line per record (see ../README.md); produce-steady
prints them for acknowledged records only, then a summary line. Diagnostics
go to stderr. Any failure exits non-zero. kafka-python has no KIP-848
consumer: --group-protocol consumer is refused.
"""

import faulthandler
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time

import kafka
import kafka.errors as ke
from kafka.structs import OffsetAndMetadata

# The matrix's command line, output and stream threads, shared with the
# other Python program (../contract.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import contract  # noqa: E402
from contract import (  # noqa: E402
    CONSUME_TIMEOUT_S, DRAIN_S, STEADY_GRACE_S, TXN_ABORT_EVERY, TXN_BATCH,
    TXN_PAUSE_S, TXN_RECORDS, emit, ev, record_json,
)


def security():
    """The tests' security settings (../contract.py), under this library's names."""
    return contract.security({"protocol": "security_protocol", "ca": "ssl_cafile", "mechanism": "sasl_mechanism",
                              "username": "sasl_plain_username", "password": "sasl_plain_password"})


def codec(name):
    return None if name == "none" else name


def produce(a):
    conf = {
        "bootstrap_servers": a.bootstrap.split(","),
        "enable_idempotence": True,
        "acks": "all",
        "compression_type": codec(a.compression),
        "linger_ms": 5,
        "batch_size": 4096,  # several batches per partition
        "delivery_timeout_ms": 60000,
    }
    if a.transactional_id:
        conf["transactional_id"] = a.transactional_id
    p = kafka.KafkaProducer(**security(), **conf)
    run = secrets.token_hex(6)
    base = int(time.time() * 1000) - a.count  # explicit, distinct, in the past
    futures = [None] * a.count
    aborted = [False] * a.count

    def send(i):
        futures[i] = p.send(a.topic, key=f"k-{i}".encode(), value=f"v-{i}-{run}".encode(),
                            headers=[("h", str(i).encode())], timestamp_ms=base + i)

    if a.transactional_id:
        p.init_transactions()
        for n, start in enumerate(range(0, a.count, TXN_BATCH)):
            # Odd-numbered transactions are aborted: half committed, a marked set aborted.
            abort = n % 2 == 1
            p.begin_transaction()
            for i in range(start, min(a.count, start + TXN_BATCH)):
                aborted[i] = abort
                send(i)
            p.flush(60)  # offsets are needed even for aborted records
            if abort:
                p.abort_transaction()
            else:
                p.commit_transaction()
    else:
        for i in range(a.count):
            send(i)
    p.flush(60)
    failures = []
    out = []
    for i, f in enumerate(futures):
        try:
            md = f.get(timeout=0)
        except Exception as e:  # noqa: BLE001 — every failure is reported
            failures.append(f"record {i}: {type(e).__name__}: {e}")
            continue
        out.append(record_json(md.partition, md.offset, f"k-{i}", f"v-{i}-{run}",
                               {"h": str(i)}, base + i, aborted[i]))
    p.close(timeout=10)
    if failures:
        sys.exit(f"produce: {len(failures)} undelivered: {failures[:5]}")
    sys.stdout.write("".join(r + "\n" for r in out))


def produce_steady(a):
    """Produces --count records spread evenly over --duration seconds with an
    idempotent acks=all producer at kafka-python's default retries and
    delivery timeout, as an application would have it. A failed record is
    counted, never fatal. Prints a line per acknowledged record, then
    {"acked":a,"failed":f,"first_error":"..."}."""
    p = kafka.KafkaProducer(**security(), bootstrap_servers=a.bootstrap.split(","),
                            enable_idempotence=True, acks="all")
    run = secrets.token_hex(6)
    base = int(time.time() * 1000) - a.count  # explicit, distinct, in the past
    results = [None] * a.count
    first_error = []
    lock = threading.Lock()

    def failed(e):
        with lock:
            if not first_error:
                first_error.append(f"{type(e).__name__}: {e}")

    def acked(i):
        def cb(md):
            results[i] = record_json(md.partition, md.offset, f"k-{i}", f"v-{i}-{run}",
                                     {"h": str(i)}, base + i)
        return cb

    start = time.monotonic()
    for i in range(a.count):
        due = start + a.duration * i / a.count
        left = due - time.monotonic()
        if left > 0:
            time.sleep(left)
        try:
            f = p.send(a.topic, key=f"k-{i}".encode(), value=f"v-{i}-{run}".encode(),
                       headers=[("h", str(i).encode())], timestamp_ms=base + i)
        except ke.KafkaError as e:
            failed(e)
            continue
        f.add_callback(acked(i))
        f.add_errback(failed)
    try:
        p.flush(STEADY_GRACE_S)
    except ke.KafkaTimeoutError:
        with lock:
            if not first_error:
                first_error.append(f"unacknowledged {STEADY_GRACE_S:.0f} s after the last send")
    acked_lines = [r for r in results if r is not None]
    sys.stdout.write("".join(r + "\n" for r in acked_lines))
    sys.stdout.write(json.dumps({
        "acked": len(acked_lines),
        "failed": a.count - len(acked_lines),
        "first_error": first_error[0] if first_error else "",
    }) + "\n")
    sys.stdout.flush()
    os._exit(0)  # do not let exit wait for what is left


def new_consumer(a, group, isolation):
    # A classic group: the command line takes no other protocol (contract.main).
    return kafka.KafkaConsumer(**security(), **{
        "bootstrap_servers": a.bootstrap.split(","),
        "group_id": group,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "isolation_level": isolation,
    })


POLL_MS = 1000  # poll's timeout: see Subscription
ASSIGN_WAIT_S = 10.0  # no partitions for this long: subscribe again


class Subscription:
    """A consumer subscribed to one topic, polled through here.

    kafka-python 3.0.12 can strand a group join: a new group's leader that
    has no metadata for the topic yet assigns nothing and rejoins once the
    metadata comes, a rejoin its coordinator derives from comparing its
    assignment and metadata snapshots, not from its rejoin flag. If poll's
    timeout ends while that second SyncGroup is in flight, the leader's own
    new assignment has made the snapshots equal by then, so the coordinator
    sees no join left to finish and never applies the SyncGroup's answer:
    the consumer polls on with no partitions, for good (its debug log has
    that SyncGroup answered and never applied; seen in 1 of 30 runs through Ferry, with
    poll's timeout at 200 ms). A longer timeout keeps both join rounds in
    the first poll; a consumer left with no partitions ASSIGN_WAIT_S
    subscribes again, which makes it join again."""

    def __init__(self, c, topic):
        self.c, self.topic = c, topic
        c.subscribe([topic])
        self.since = time.monotonic()

    def poll(self, **kw):
        got = self.c.poll(timeout_ms=POLL_MS, **kw)
        if self.c.assignment():
            self.since = time.monotonic()
        elif time.monotonic() - self.since > ASSIGN_WAIT_S:
            print(f"client.py: no partitions of {self.topic} assigned in {ASSIGN_WAIT_S:.0f} s; "
                  "subscribing again (a join kafka-python left stranded?)", file=sys.stderr)
            self.c.unsubscribe()
            self.c.subscribe([self.topic])
            self.since = time.monotonic()
        return got


def consume(a):
    c = new_consumer(a, a.group, a.isolation)
    sub = Subscription(c, a.topic)
    out = []
    deadline = time.monotonic() + CONSUME_TIMEOUT_S

    def poll():
        for _, msgs in sub.poll().items():
            for m in msgs:
                headers = {k: (v.decode() if v is not None else None) for k, v in (m.headers or [])}
                out.append(record_json(
                    m.partition, m.offset,
                    m.key.decode() if m.key is not None else None,
                    m.value.decode() if m.value is not None else None,
                    headers, m.timestamp))

    while len(out) < a.count and time.monotonic() < deadline:
        poll()

    # Drain to the end offsets (last stable offsets under read_committed), so
    # extra records show up and committed positions step over trailing
    # aborted records and transaction markers.
    def caught_up():
        tps = list(c.assignment())
        ends = c.end_offsets(tps, timeout_ms=10000)
        return all(c.position(tp, timeout_ms=10000) >= ends[tp] for tp in tps)

    drain_until = min(deadline, time.monotonic() + DRAIN_S)
    while time.monotonic() < drain_until and not caught_up():
        poll()
    if len(out) < a.count:
        print(f"consume: timed out with {len(out)} of {a.count} records", file=sys.stderr)
    # Commit every assigned partition's position (the next offset to read).
    positions = {tp: OffsetAndMetadata(c.position(tp, timeout_ms=10000), "", -1) for tp in c.assignment()}
    if positions:
        c.commit(offsets=positions, timeout_ms=30000)
    c.close()
    sys.stdout.write("".join(r + "\n" for r in out))


# ---- stream ----

def emit_error(role, err, fatal=False):
    """Prints an error; code is the exception's class (kafka-python names
    its errors after Kafka's error codes, e.g. NotLeaderForPartitionError)."""
    retriable = getattr(err, "retriable", False)
    emit(ev(role, "error", code=type(err).__name__, error=str(err), fatal=fatal, retriable=retriable))


def produce_role(a, topic, stop):
    """An idempotent producer at kafka-python's defaults, --rate records a
    second round robin over the partitions."""
    role = "produce"
    p = kafka.KafkaProducer(**security(), bootstrap_servers=a.bootstrap.split(","),
                            enable_idempotence=True, acks="all")
    run = secrets.token_hex(6)
    seq = [0] * a.partitions

    def acked(v):
        return lambda md: emit(ev(role, "ack", partition=md.partition, offset=md.offset, value=v))

    start = time.monotonic()
    i = 0
    while not stop.is_set():
        wait = start + i / a.rate - time.monotonic()
        if wait > 0:
            stop.wait(min(wait, 0.05))
            continue
        part = i % a.partitions
        v = "p%d-%06d-%s" % (part, seq[part] + 1, run)
        try:
            f = p.send(topic, value=v.encode(), partition=part)
            f.add_callback(acked(v))
            f.add_errback(lambda e: emit_error(role, e))
        except ke.KafkaError as e:
            emit_error(role, e)
        seq[part] += 1
        i += 1
    try:
        p.flush(STEADY_GRACE_S)
    except ke.KafkaTimeoutError:
        emit(ev(role, "error", code="TIMEOUT", fatal=False,
                error=f"records unacknowledged {STEADY_GRACE_S:.0f} s after the last send"))
    p.close(timeout=0)


def txn_role(a, spec, stop):
    """A transactional producer: transactions of TXN_RECORDS records, every
    TXN_ABORT_EVERY-th aborted on purpose. On an error it aborts and carries
    on with a new transaction; when the producer cannot abort (kafka-python
    took the error as fatal) it goes on with a new producer; an error that
    stops the new one is fatal and ends the role."""
    role = "txn"
    topic, txn_id = spec.split(":", 1)

    def new_producer():
        p = kafka.KafkaProducer(**security(), bootstrap_servers=a.bootstrap.split(","),
                                transactional_id=txn_id, enable_idempotence=True, acks="all")
        p.init_transactions()
        return p

    p = new_producer()
    run = secrets.token_hex(6)
    seq = [0] * a.partitions
    k = 0
    n = 0
    while not stop.is_set():
        n += 1
        abort = n % TXN_ABORT_EVERY == 0
        sent = []
        try:
            p.begin_transaction()
            for _ in range(TXN_RECORDS):
                part = k % a.partitions
                k += 1
                seq[part] += 1
                v = "p%d-%06d-t%d-%s" % (part, seq[part], n, run)
                sent.append((v, p.send(topic, value=v.encode(), partition=part)))
            p.flush(60)
            emit_acked(role, n, sent)
            sent = []
            if abort:
                p.abort_transaction()
                emit(ev(role, "end", txn=n, outcome="aborted"))
            else:
                p.commit_transaction()
                emit(ev(role, "end", txn=n, outcome="committed"))
        except Exception as e:  # noqa: BLE001 — the application aborts on any error
            emit_error(role, e)
            emit_acked(role, n, sent)
            try:
                p.abort_transaction()
            except Exception as e2:  # noqa: BLE001
                # kafka-python takes every answer to EndTxn but success and
                # the retriable ones as fatal (UNKNOWN_PRODUCER_ID, Ferry's
                # answer after a switch, which Java and librdkafka abort on;
                # a commit fenced by the transaction timeout alike): the
                # producer refuses every call after. Its users' way on, and
                # the role's: close it and go on with a new producer of the
                # same transactional.id, whose InitProducerId aborts what the
                # old one left open.
                emit_error(role, e2)
                p.close(timeout=0)
                try:
                    p = new_producer()
                except Exception as e3:  # noqa: BLE001
                    emit_error(role, e3, True)
                    return
            emit(ev(role, "end", txn=n, outcome="aborted", after_error=True))
        time.sleep(TXN_PAUSE_S)
    p.close(timeout=10)


def emit_acked(role, txn, sent):
    for v, f in sent:
        if f.is_done and f.succeeded():
            md = f.value
            emit(ev(role, "ack", partition=md.partition, offset=md.offset, value=v, txn=txn))


def consume_role(a, spec, stop):
    """A consumer group member that commits, after every poll that returned
    records, the offset after the last record read of each partition."""
    role, topic, group, _, isolation = spec.split(":")
    c = new_consumer(a, group, isolation)
    sub = Subscription(c, topic)

    def commit(offsets):
        if not offsets:
            return
        try:
            c.commit(offsets={tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()}, timeout_ms=30000)
        except Exception as e:  # noqa: BLE001 — a failed commit is reported, not fatal
            emit_error(role, e)
            return
        emit(ev(role, "committed", offsets={str(tp.partition): o for tp, o in offsets.items()}))

    while not stop.is_set():
        read = {}
        try:
            got = sub.poll(max_records=500)
        except Exception as e:  # noqa: BLE001 — a failed poll is reported, not fatal
            emit_error(role, e)
            time.sleep(0.1)
            continue
        for tp, msgs in got.items():
            for m in msgs:
                emit(ev(role, "rec", partition=m.partition, offset=m.offset,
                        value=m.value.decode() if m.value is not None else None))
                read[tp] = m.offset + 1
        commit(read)
    # Leaving: commit the positions of what is still assigned.
    final = {}
    for tp in c.assignment():
        try:
            final[tp] = c.position(tp, timeout_ms=10000)
        except Exception as e:  # noqa: BLE001
            emit_error(role, e)
    commit({tp: o for tp, o in final.items() if o is not None})
    c.close()


def main():
    # SIGUSR1 prints every thread's stack to stderr: for a run that hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # kafka-python logs through logging; its warnings and errors go to
    # stderr, everything with KAFKA_PYTHON_DEBUG=1 (for a run that needs
    # explaining).
    level = logging.DEBUG if os.environ.get("KAFKA_PYTHON_DEBUG") else logging.WARNING
    logging.basicConfig(stream=sys.stderr, level=level,
                        format="client.py: %(name)s %(levelname)s: %(message)s")
    contract.main({"produce": produce, "produce-steady": produce_steady, "consume": consume},
                  {"produce": produce_role, "txn": txn_role, "consume": consume_role},
                  emit_error, group_protocols=("classic",))


if __name__ == "__main__":
    main()
