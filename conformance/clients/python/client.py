"""librdkafka (confluent_kafka) member of Ferry's client conformance matrix.

The Go tests in conformance/ run it with the venv's python that
conformance/clients/install.sh creates:

    produce --bootstrap B --topic T --count N [--compression C] [--transactional-id X]
    consume --bootstrap B --topic T --group G --count N [--isolation read_committed]
            [--group-protocol classic|consumer]
    produce-steady --bootstrap B --topic T --count N --duration S
    stream --bootstrap B --partitions P --rate R [--produce T] [--txn T:ID]
           [--consume NAME:T:GROUP:PROTOCOL:ISOLATION]...

Each prints one JSON line per record (see ../README.md); produce-steady
prints them for acknowledged records only, then a summary line. Diagnostics go to
stderr. Any failure exits non-zero.
"""

import json
import os
import secrets
import sys
import time

import confluent_kafka as ck

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
    return contract.security({"protocol": "security.protocol", "ca": "ssl.ca.location", "mechanism": "sasl.mechanism",
                              "username": "sasl.username", "password": "sasl.password"})


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
    p = ck.Producer(**security(), **conf)
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
    p = ck.Producer(**security(), **{
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
    c = ck.Consumer(**security(), **conf)
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


# ---- stream ----

def emit_error(role, err, fatal=False):
    """Prints an error; code is librdkafka's error name when there is one."""
    if isinstance(err, ck.KafkaException) and err.args and isinstance(err.args[0], ck.KafkaError):
        err = err.args[0]
    if isinstance(err, ck.KafkaError):
        emit(ev(role, "error", code=err.name(), error=err.str(), fatal=fatal or err.fatal(),
                retriable=err.retriable(), txn_requires_abort=err.txn_requires_abort()))
    else:
        emit(ev(role, "error", code=type(err).__name__, error=str(err), fatal=fatal))


def debug():
    """librdkafka's debug log, on standard error, when LIBRDKAFKA_DEBUG names
    its contexts (e.g. "eos,msg"): for a run that needs explaining."""
    contexts = os.environ.get("LIBRDKAFKA_DEBUG", "")
    return {"debug": contexts} if contexts else {}


def log_role(role):
    # librdkafka's error_cb reports client-level conditions (a broker down,
    # a fatal idempotence error); only a fatal one is the application's.
    def cb(err):
        print(f"client.py: {role}: librdkafka error: {err}", file=sys.stderr)
        if err.fatal():
            emit_error(role, err, True)
    return cb


def produce_role(a, topic, stop):
    """An idempotent producer at librdkafka's defaults, --rate records a
    second round robin over the partitions."""
    role = "produce"
    p = ck.Producer(**security(), **{
        "bootstrap.servers": a.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "error_cb": log_role(role),
        **debug(),
    })
    run = secrets.token_hex(6)
    seq = [0] * a.partitions

    def cb(v):
        def f(err, msg):
            if err is not None:
                emit_error(role, err)
            else:
                emit(ev(role, "ack", partition=msg.partition(), offset=msg.offset(), value=v))
        return f

    start = time.monotonic()
    i = 0
    while not stop.is_set():
        wait = start + i / a.rate - time.monotonic()
        if wait > 0:
            p.poll(min(wait, 0.05))
            continue
        part = i % a.partitions
        v = "p%d-%06d-%s" % (part, seq[part] + 1, run)
        try:
            p.produce(topic, value=v, partition=part, on_delivery=cb(v))
        except BufferError:
            p.poll(0.05)
            continue
        except ck.KafkaException as e:
            emit_error(role, e)
        seq[part] += 1
        i += 1
        p.poll(0)
    left = p.flush(STEADY_GRACE_S)
    if left:
        emit(ev(role, "error", code="TIMEOUT", fatal=False,
                error=f"{left} records unacknowledged {STEADY_GRACE_S:.0f} s after the last send"))
        p.purge()


def txn_role(a, spec, stop):
    """A transactional producer: transactions of TXN_RECORDS records, every
    TXN_ABORT_EVERY-th aborted on purpose. On an error it aborts and carries
    on with a new transaction; a fatal error ends the role."""
    role = "txn"
    topic, txn_id = spec.split(":", 1)
    p = ck.Producer(**security(), **{
        "bootstrap.servers": a.bootstrap,
        "transactional.id": txn_id,
        "enable.idempotence": True,
        "acks": "all",
        "error_cb": log_role(role),
        **debug(),
    })
    run = secrets.token_hex(6)
    seq = [0] * a.partitions
    p.init_transactions(60)
    k = 0
    n = 0

    def retrying(f):
        # A retriable error of a transactional call means: call it again.
        for attempt in range(10):
            try:
                return f()
            except ck.KafkaException as e:
                err = e.args[0]
                if not err.retriable() or attempt == 9:
                    raise
                emit(ev(role, "retry", code=err.name(), error=err.str()))
                time.sleep(0.1)

    while not stop.is_set():
        n += 1
        abort = n % TXN_ABORT_EVERY == 0
        acked = []

        def cb(v, txn=n, acked=acked):
            def f(err, msg):
                if err is None:
                    acked.append(ev(role, "ack", partition=msg.partition(), offset=msg.offset(), value=v, txn=txn))
            return f

        try:
            p.begin_transaction()
            for _ in range(TXN_RECORDS):
                part = k % a.partitions
                k += 1
                seq[part] += 1
                v = "p%d-%06d-t%d-%s" % (part, seq[part], n, run)
                p.produce(topic, value=v, partition=part, on_delivery=cb(v))
            p.flush(60)
            for m in acked:
                emit(m)
            acked.clear()
            if abort:
                retrying(lambda: p.abort_transaction(60))
                emit(ev(role, "end", txn=n, outcome="aborted"))
            else:
                retrying(lambda: p.commit_transaction(60))
                emit(ev(role, "end", txn=n, outcome="committed"))
        except ck.KafkaException as e:
            err = e.args[0]
            emit_error(role, err)
            for m in acked:
                emit(m)
            if err.fatal():
                return
            try:
                retrying(lambda: p.abort_transaction(60))
            except ck.KafkaException as e2:
                emit_error(role, e2, True)
                return
            emit(ev(role, "end", txn=n, outcome="aborted", after_error=True))
        time.sleep(TXN_PAUSE_S)
    p.flush(10)


def consume_role(a, spec, stop):
    """A consumer group member that commits its position after every poll
    that returned records."""
    role, topic, group, protocol, isolation = spec.split(":")
    conf = {
        "bootstrap.servers": a.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "error_cb": log_role(role),
    }
    if protocol != "classic":
        conf["group.protocol"] = protocol
    c = ck.Consumer(**security(), **conf)
    c.subscribe([topic])

    def commit():
        try:
            done = c.commit(asynchronous=False)
        except ck.KafkaException as e:
            if e.args[0].code() != ck.KafkaError._NO_OFFSET:
                emit_error(role, e)
            return
        offsets = {str(tp.partition): tp.offset for tp in done or []
                   if tp.error is None and tp.offset >= 0}
        if offsets:
            emit(ev(role, "committed", offsets=offsets))

    while not stop.is_set():
        got = False
        for msg in c.consume(num_messages=500, timeout=0.2):
            if msg.error():
                if msg.error().code() != ck.KafkaError._PARTITION_EOF:
                    emit_error(role, msg.error())
                continue
            emit(ev(role, "rec", partition=msg.partition(), offset=msg.offset(),
                    value=msg.value().decode() if msg.value() is not None else None))
            got = True
        if got:
            commit()
    commit()
    c.close()


if __name__ == "__main__":
    contract.main({"produce": produce, "produce-steady": produce_steady, "consume": consume},
                  {"produce": produce_role, "txn": txn_role, "consume": consume_role},
                  emit_error)
