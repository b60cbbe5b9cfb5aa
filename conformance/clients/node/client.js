'use strict'
// kafkajs member of Ferry's client conformance matrix. The Go tests in
// conformance/ run it with node after conformance/clients/install.sh has run
// `npm ci` here:
//
//   produce --bootstrap B --topic T --count N [--compression none|gzip|snappy] [--transactional-id X]
//   consume --bootstrap B --topic T --group G --count N [--isolation read_committed]
//   produce-steady --bootstrap B --topic T --count N --duration S
//   stream --bootstrap B --partitions P --rate R [--produce T] [--txn T:ID]
//          [--consume NAME:T:GROUP:PROTOCOL:ISOLATION]...
//
// Each prints one JSON line per record (see ../README.md); produce-steady
// prints them for acknowledged records only, then a summary line. Diagnostics go to
// stderr. Any failure exits non-zero. kafkajs ships gzip; snappy comes from
// kafkajs-snappy; lz4 and zstd would need native codecs and are refused.

const crypto = require('crypto')
const {
  Kafka, CompressionTypes, CompressionCodecs, Partitioners, logLevel,
} = require('kafkajs')

CompressionCodecs[CompressionTypes.Snappy] = require('kafkajs-snappy')

const CONSUME_TIMEOUT_MS = 60000
const DRAIN_MS = 10000 // how long consume keeps reading past --count to reach the end offsets
const WATCHDOG_MS = 90000 // kafkajs retries connecting for a long time; give up before the test does (produce-steady: plus --duration)
const SEND_CHUNK = 50 // records per producer.send, so a run makes several batches per partition
const TXN_BATCH = 25 // records per transaction (one send each) in transactional produce
const STEADY_GRACE_MS = 60000 // how long produce-steady waits for a send after the last record is due

const COMPRESSION = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
}

function usage (why) {
  process.stderr.write(`client.js: ${why}\n` +
    'usage: client.js produce|consume|produce-steady --bootstrap B --topic T --count N [flags]\n')
  process.exit(2)
}

function parseFlags (argv) {
  const a = { compression: 'none', isolation: 'read_uncommitted', 'group-protocol': 'classic' }
  for (let i = 1; i < argv.length; i += 2) {
    if (!argv[i].startsWith('--') || i + 1 >= argv.length) usage(`bad argument ${argv[i]}`)
    a[argv[i].slice(2)] = argv[i + 1]
  }
  for (const f of ['bootstrap', 'topic', 'count']) if (!(f in a)) usage(`missing --${f}`)
  a.count = Number(a.count)
  return a
}

// stderrLogger keeps kafkajs's logs off stdout, which carries the records.
function stderrLogger () {
  return ({ namespace, level, label, log }) => {
    const { message, ...extra } = log
    process.stderr.write(`kafkajs ${label} [${namespace}] ${message} ${JSON.stringify(extra)}\n`)
  }
}

function recordJSON (partition, offset, key, value, headers, timestamp, aborted) {
  const r = { partition, offset, key, value, headers, timestamp }
  if (aborted) r.aborted = true
  return JSON.stringify(r)
}

// security is the client-side security the tests pass in the environment
// (clients/README.md, "Security"): nothing when
// CONFORMANCE_SECURITY_PROTOCOL is unset.
function security () {
  const proto = process.env.CONFORMANCE_SECURITY_PROTOCOL || ''
  if (!proto) return {}
  const out = {}
  if (proto === 'SSL' || proto === 'SASL_SSL') {
    out.ssl = process.env.CONFORMANCE_SSL_CA_FILE
      ? { ca: [require('fs').readFileSync(process.env.CONFORMANCE_SSL_CA_FILE, 'utf8')] }
      : true
  }
  if (proto.startsWith('SASL_')) {
    out.sasl = {
      mechanism: (process.env.CONFORMANCE_SASL_MECHANISM || '').toLowerCase(),
      username: process.env.CONFORMANCE_SASL_USERNAME,
      password: process.env.CONFORMANCE_SASL_PASSWORD,
    }
  }
  return out
}

// kafkaConfig is what every client of the harness is made of (bootstrap,
// security, logging), with extra added.
function kafkaConfig (a, extra) {
  return {
    clientId: 'ferry-conformance-kafkajs',
    brokers: a.bootstrap.split(','),
    ...security(),
    logLevel: logLevel.ERROR,
    logCreator: stderrLogger,
    ...extra,
  }
}

function newKafka (a) {
  return new Kafka(kafkaConfig(a, {
    // Short backoffs: a transaction right after the previous commit meets
    // CONCURRENT_TRANSACTIONS until its markers are written.
    retry: { initialRetryTime: 100, maxRetryTime: 2000, retries: 15 },
  }))
}

// sendByPartition sends messages one partition at a time, in turn, and
// returns kafkajs's acks of all of them. A transactional send must never
// span two leaders in kafkajs 2.2.4: sendMessages sends to every leader at
// once under Promise.all, and when one leader's AddPartitionsToTxn fails
// (CONCURRENT_TRANSACTIONS right after the previous commit) its retry sends
// again to every leader that has not answered yet, with the next sequence
// numbers, so a produce still in flight is written twice inside the
// transaction (read in kafkajs's src/producer/sendMessages.js: a client
// race, whatever it talks to). One leader per send leaves nothing in flight
// to repeat.
async function sendByPartition (sender, record, messages) {
  const byPartition = new Map()
  for (const m of messages) {
    if (!byPartition.has(m.partition)) byPartition.set(m.partition, [])
    byPartition.get(m.partition).push(m)
  }
  const acks = []
  for (const ms of byPartition.values()) {
    acks.push(...await sender.send({ ...record, messages: ms }))
  }
  return acks
}

async function produce (a) {
  if (!(a.compression in COMPRESSION)) usage(`compression ${a.compression} is not supported by this client`)
  const kafka = newKafka(a)

  // kafkajs's send reports one base offset per partition, not a partition per
  // message, so pick each message's partition up front with kafkajs's own
  // default partitioner and set it explicitly.
  const admin = kafka.admin()
  await admin.connect()
  const md = await admin.fetchTopicMetadata({ topics: [a.topic] })
  await admin.disconnect()
  const partitionMetadata = md.topics[0].partitions
  const partitioner = Partitioners.DefaultPartitioner()

  const txnId = a['transactional-id']
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, transactionalId: txnId })
  await producer.connect()
  const run = crypto.randomBytes(6).toString('hex')
  const base = Date.now() - a.count // explicit, distinct, in the past
  const out = []
  const chunk = txnId ? TXN_BATCH : SEND_CHUNK
  for (let start = 0, n = 0; start < a.count; start += chunk, n++) {
    // Odd-numbered transactions are aborted: half committed, a marked set aborted.
    const aborted = Boolean(txnId) && n % 2 === 1
    const sender = txnId ? await producer.transaction() : producer
    const messages = []
    for (let i = start; i < Math.min(a.count, start + chunk); i++) {
      const m = { key: `k-${i}`, value: `v-${i}-${run}`, headers: { h: String(i) }, timestamp: String(base + i) }
      m.partition = partitioner({ topic: a.topic, partitionMetadata, message: m })
      messages.push(m)
    }
    const res = txnId
      ? await sendByPartition(sender, { topic: a.topic, acks: -1, compression: COMPRESSION[a.compression] }, messages)
      : await sender.send({ topic: a.topic, acks: -1, compression: COMPRESSION[a.compression], messages })
    const baseOffset = new Map(res.map(r => [r.partition, BigInt(r.baseOffset)]))
    const next = new Map()
    for (const m of messages) {
      const idx = next.get(m.partition) || 0n
      next.set(m.partition, idx + 1n)
      if (!baseOffset.has(m.partition)) throw new Error(`no ack for partition ${m.partition}`)
      out.push(recordJSON(m.partition, Number(baseOffset.get(m.partition) + idx),
        m.key, m.value, m.headers, Number(m.timestamp), aborted))
    }
    if (txnId) await (aborted ? sender.abort() : sender.commit())
  }
  await producer.disconnect()
  return out
}

// produceSteady produces --count records spread evenly over --duration
// seconds with an idempotent acks=all producer at kafkajs's default retries
// (the Kafka and producer objects get no retry options), as an application
// would have it: 5 retries, about 9 s of backoff, since Kafka.producer
// always passes a retry object and the idempotent default of
// Number.MAX_SAFE_INTEGER never applies. Every few milliseconds it sends what is due: one send per
// partition, those of different partitions at once, the next round after
// they all settled. (One send spanning partitions of several brokers loses
// a partition whose leader moves mid-send to a broker that already
// answered: kafkajs resolves the send without it and rolls its sequence
// back, and the partition's next batch meets OUT_OF_ORDER_SEQUENCE_NUMBER
// for good. That is kafkajs's, directly as through a gateway, and would
// drown what this mode is for.) A send that fails fails its records, which
// are counted, never fatal. Returns a line per acknowledged record, then
// {"acked":a,"failed":f,"first_error":"..."}.
async function produceSteady (a) {
  const duration = Number(a.duration) * 1000
  if (!(duration >= 0)) usage('produce-steady needs --duration S')
  const kafka = new Kafka({
    clientId: 'ferry-conformance-kafkajs',
    brokers: a.bootstrap.split(','),
    ...security(),
    logLevel: logLevel.ERROR,
    logCreator: stderrLogger,
  })
  const producer = kafka.producer({ idempotent: true })
  let partitionMetadata
  try {
    const admin = kafka.admin()
    await admin.connect()
    const md = await admin.fetchTopicMetadata({ topics: [a.topic] })
    await admin.disconnect()
    partitionMetadata = md.topics[0].partitions
    await producer.connect()
  } catch (err) {
    // An application whose producer cannot start sends nothing: every
    // record fails.
    return [JSON.stringify({ acked: 0, failed: a.count, first_error: `starting: ${err.name}: ${err.message}` })]
  }
  const partitioner = Partitioners.DefaultPartitioner()
  const run = crypto.randomBytes(6).toString('hex')
  const base = Date.now() - a.count // explicit, distinct, in the past
  const acked = new Array(a.count).fill(null)
  let firstError = ''
  const start = Date.now()
  const giveUp = start + duration + STEADY_GRACE_MS

  // sendPartition sends one partition's due messages and records their acks.
  const sendPartition = async (partition, messages) => {
    let timer
    const timeout = new Promise((resolve, reject) => {
      timer = setTimeout(() => reject(new Error(`send unanswered ${STEADY_GRACE_MS} ms after the last record was due`)),
        Math.max(0, giveUp - Date.now()))
    })
    try {
      const res = await Promise.race([producer.send({ topic: a.topic, acks: -1, messages }), timeout])
      const ack = res.find(r => r.partition === partition)
      if (!ack) throw new Error(`send resolved without an ack for partition ${partition}`)
      messages.forEach((m, j) => {
        acked[m.i] = recordJSON(partition, Number(BigInt(ack.baseOffset) + BigInt(j)),
          m.key, m.value, m.headers, Number(m.timestamp), false)
      })
    } catch (err) {
      if (!firstError) firstError = err && err.message ? `${err.name}: ${err.message}` : String(err)
    } finally {
      clearTimeout(timer)
    }
  }

  let next = 0
  while (next < a.count && Date.now() < giveUp) {
    // Record i is due at start + i*duration/count.
    const due = Math.min(a.count, Math.floor((Date.now() - start) * a.count / Math.max(duration, 1)) + 1)
    if (due <= next) {
      await sleep(Math.max(1, start + next * duration / a.count - Date.now()))
      continue
    }
    const byPartition = new Map()
    for (let i = next; i < due; i++) {
      const m = { i, key: `k-${i}`, value: `v-${i}-${run}`, headers: { h: String(i) }, timestamp: String(base + i) }
      m.partition = partitioner({ topic: a.topic, partitionMetadata, message: m })
      if (!byPartition.has(m.partition)) byPartition.set(m.partition, [])
      byPartition.get(m.partition).push(m)
    }
    next = due
    await Promise.all([...byPartition].map(([p, ms]) => sendPartition(p, ms)))
  }
  if (next < a.count && !firstError) firstError = `${a.count - next} records never sent: out of time`
  const out = acked.filter(r => r !== null)
  out.push(JSON.stringify({ acked: out.length, failed: a.count - out.length, first_error: firstError }))
  // A send still stuck in kafkajs's retries must not hold the exit.
  await Promise.race([producer.disconnect(), sleep(2000)])
  return out
}

async function consume (a) {
  if (!a.group) usage('consume needs --group')
  if (a['group-protocol'] !== 'classic') usage(`group protocol ${a['group-protocol']} is not supported by this client`)
  const kafka = newKafka(a)
  const consumer = kafka.consumer({
    groupId: a.group,
    readUncommitted: a.isolation !== 'read_committed',
    maxWaitTimeInMs: 200,
  })
  const out = []
  // partition -> next offset to read. Besides the records seen, kafkajs
  // reports each fetched batch's last offset, which steps over transaction
  // markers and aborted records that never reach eachMessage.
  const next = new Map()
  const advance = (partition, last) => {
    if (!next.has(partition) || next.get(partition) <= last) next.set(partition, last + 1n)
  }
  consumer.on(consumer.events.END_BATCH_PROCESS, ({ payload }) => {
    if (payload.topic === a.topic) advance(payload.partition, BigInt(payload.lastOffset))
  })
  let reached, crashed
  const reachedCount = new Promise((resolve, reject) => { reached = resolve; crashed = reject })
  // A crash that kafkajs will not restart from ends the run with an error
  // (for example a codec this client lacks) instead of waiting for the timeout.
  consumer.on(consumer.events.CRASH, ({ payload }) => {
    if (!payload.restart) crashed(payload.error)
  })
  await consumer.connect()
  await consumer.subscribe({ topics: [a.topic], fromBeginning: true })
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      const headers = {}
      for (const [k, v] of Object.entries(message.headers || {})) headers[k] = v == null ? null : v.toString()
      out.push(recordJSON(partition, Number(message.offset),
        message.key == null ? null : message.key.toString(),
        message.value == null ? null : message.value.toString(),
        headers, Number(message.timestamp)))
      advance(partition, BigInt(message.offset))
      if (out.length >= a.count) reached()
    },
  })
  const deadline = Date.now() + CONSUME_TIMEOUT_MS
  let timer
  await Promise.race([reachedCount, new Promise(resolve => { timer = setTimeout(resolve, CONSUME_TIMEOUT_MS) })])
  clearTimeout(timer)

  // Drain to the end offsets so that extra records show up.
  const admin = kafka.admin()
  await admin.connect()
  const ends = await admin.fetchTopicOffsets(a.topic)
  await admin.disconnect()
  const drainUntil = Math.min(deadline, Date.now() + DRAIN_MS)
  const caughtUp = () => ends.every(e => BigInt(e.high) <= BigInt(e.low) || (next.get(e.partition) || 0n) >= BigInt(e.high))
  while (Date.now() < drainUntil && !caughtUp()) await sleep(50)
  if (out.length < a.count) process.stderr.write(`consume: timed out with ${out.length} of ${a.count} records\n`)

  const offsets = [...next].map(([partition, off]) => ({ topic: a.topic, partition, offset: String(off) }))
  if (offsets.length > 0) await consumer.commitOffsets(offsets)
  await consumer.disconnect()
  return out
}

// ---- stream ----

const TXN_RECORDS = 10 // records per transaction in stream's txn role
const TXN_ABORT_EVERY = 4 // every 4th transaction is aborted on purpose
const TXN_PAUSE_MS = 100 // pause between transactions

function emit (m) {
  process.stdout.write(JSON.stringify(m) + '\n')
}

// emitError prints an error; code is the Kafka error's type when kafkajs
// has one (also of a retry wrapper's cause), else the error's name.
function emitError (role, err, fatal) {
  let code = err && err.name ? err.name : 'Error'
  const inner = err && err.type ? err : err && err.cause && err.cause.type ? err.cause : null
  if (inner) code += '/' + inner.type
  emit({ role, ev: 'error', code, error: err && err.message ? err.message : String(err), fatal: Boolean(fatal) })
}

function streamKafka (a) {
  return new Kafka(kafkaConfig(a))
}

// produceRole is an idempotent producer at kafkajs's defaults, --rate
// records a second round robin over the partitions: every few
// milliseconds it sends what is due, one send per partition (at once), the
// next round after they all settled (see produceSteady).
async function produceRole (a, topic, stop) {
  const role = 'produce'
  const producer = streamKafka(a).producer({ idempotent: true })
  await producer.connect()
  const run = crypto.randomBytes(6).toString('hex')
  const seq = new Array(a.partitions).fill(0)
  const start = Date.now()
  let i = 0
  while (!stop.stopped) {
    const due = Math.floor((Date.now() - start) * a.rate / 1000) + 1
    if (due <= i) {
      await sleep(5)
      continue
    }
    const byPartition = new Map()
    for (; i < due; i++) {
      const p = i % a.partitions
      seq[p]++
      if (!byPartition.has(p)) byPartition.set(p, [])
      byPartition.get(p).push(`p${p}-${String(seq[p]).padStart(6, '0')}-${run}`)
    }
    await Promise.all([...byPartition].map(async ([p, vals]) => {
      try {
        const res = await producer.send({ topic, acks: -1, messages: vals.map(value => ({ partition: p, value })) })
        const ack = res.find(r => r.partition === p)
        if (!ack) throw new Error(`send resolved without an ack for partition ${p}`)
        vals.forEach((value, j) => emit({ role, ev: 'ack', partition: p, offset: Number(BigInt(ack.baseOffset) + BigInt(j)), value }))
      } catch (err) {
        emitError(role, err, false)
      }
    }))
  }
  await Promise.race([producer.disconnect(), sleep(2000)])
}

// txnRole is a transactional producer: transactions of TXN_RECORDS records,
// every TXN_ABORT_EVERY-th aborted on purpose. On an error it aborts and
// carries on with a new transaction; an error the abort cannot get past ends
// the role (fatal). A commit that fails leaves kafkajs's producer in state
// COMMITTING for good (its EndTxn has no retry and no way back, whatever
// the error: NOT_COORDINATOR from a cluster as much as UNKNOWN_PRODUCER_ID
// from a switch that aborted the transaction), so the role does what a
// kafkajs application must: it opens a new producer under the same
// transactional ID and goes on.
async function txnRole (a, spec, stop) {
  const role = 'txn'
  const [topic, transactionalId] = spec.split(/:(.*)/s)
  const newProducer = async () => {
    const p = streamKafka(a).producer({ idempotent: true, maxInFlightRequests: 1, transactionalId })
    await p.connect()
    return p
  }
  let producer = await newProducer()
  const run = crypto.randomBytes(6).toString('hex')
  const seq = new Array(a.partitions).fill(0)
  let k = 0
  for (let n = 1; !stop.stopped; n++) {
    const abort = n % TXN_ABORT_EVERY === 0
    let txn
    let committing = false
    try {
      txn = await producer.transaction()
      const messages = []
      for (let j = 0; j < TXN_RECORDS; j++) {
        const p = k++ % a.partitions
        seq[p]++
        messages.push({ partition: p, value: `p${p}-${String(seq[p]).padStart(6, '0')}-t${n}-${run}` })
      }
      const res = await sendByPartition(txn, { topic, acks: -1 }, messages)
      const next = new Map()
      for (const m of messages) {
        const ack = res.find(r => r.partition === m.partition)
        if (!ack) throw new Error(`send resolved without an ack for partition ${m.partition}`)
        const j = next.get(m.partition) || 0n
        next.set(m.partition, j + 1n)
        emit({ role, ev: 'ack', partition: m.partition, offset: Number(BigInt(ack.baseOffset) + j), value: m.value, txn: n })
      }
      committing = true
      if (abort) await txn.abort()
      else await txn.commit()
      emit({ role, ev: 'end', txn: n, outcome: abort ? 'aborted' : 'committed' })
    } catch (err) {
      emitError(role, err, false)
      try {
        if (committing) {
          await Promise.race([producer.disconnect(), sleep(2000)])
          producer = await newProducer()
        } else if (txn && txn.isActive()) await txn.abort()
      } catch (err2) {
        emitError(role, err2, true)
        break
      }
      emit({ role, ev: 'end', txn: n, outcome: 'aborted', after_error: true })
    }
    await sleep(TXN_PAUSE_MS)
  }
  await Promise.race([producer.disconnect(), sleep(2000)])
}

// consumeRole is a consumer group member (classic protocol: kafkajs has no
// other) that commits after every batch of records.
async function consumeRole (a, spec, stop) {
  const [role, topic, groupId, protocol, isolation] = spec.split(':')
  if (protocol !== 'classic') throw new Error(`group protocol ${protocol} is not supported by this client`)
  const consumer = streamKafka(a).consumer({ groupId, readUncommitted: isolation !== 'read_committed', maxWaitTimeInMs: 200 })
  consumer.on(consumer.events.CRASH, ({ payload }) => emitError(role, payload.error, !payload.restart))
  await consumer.connect()
  await consumer.subscribe({ topics: [topic], fromBeginning: true })
  await consumer.run({
    autoCommit: false,
    eachBatch: async ({ batch }) => {
      if (batch.messages.length === 0) return
      for (const m of batch.messages) {
        emit({ role, ev: 'rec', partition: batch.partition, offset: Number(m.offset), value: m.value == null ? null : m.value.toString() })
      }
      const next = BigInt(batch.messages[batch.messages.length - 1].offset) + 1n
      try {
        await consumer.commitOffsets([{ topic, partition: batch.partition, offset: String(next) }])
        emit({ role, ev: 'committed', offsets: { [batch.partition]: Number(next) } })
      } catch (err) {
        emitError(role, err, false)
      }
    },
  })
  await stop.promise
  await Promise.race([consumer.disconnect(), sleep(5000)])
}

// stream runs the roles asked for at once until stopped: a stdin line
// "stop ROLE" stops one, the end of stdin every one left. Each prints one
// JSON line per event (see ../README.md).
async function stream (argv) {
  const a = { partitions: 3, rate: 100, consume: [] }
  for (let i = 1; i < argv.length; i += 2) {
    if (!argv[i].startsWith('--') || i + 1 >= argv.length) usage(`bad argument ${argv[i]}`)
    const k = argv[i].slice(2)
    if (k === 'consume') a.consume.push(argv[i + 1])
    else a[k] = argv[i + 1]
  }
  if (!a.bootstrap) usage('missing --bootstrap')
  a.partitions = Number(a.partitions)
  a.rate = Number(a.rate)
  const roles = []
  if (a.produce) roles.push(['produce', produceRole, a.produce])
  if (a.txn) roles.push(['txn', txnRole, a.txn])
  for (const spec of a.consume) {
    if (spec.split(':').length !== 5) usage(`--consume NAME:TOPIC:GROUP:PROTOCOL:ISOLATION, got ${spec}`)
    roles.push([spec.split(':')[0], consumeRole, spec])
  }
  const stops = new Map()
  for (const [name] of roles) {
    const s = { stopped: false }
    s.promise = new Promise(resolve => { s.resolve = resolve })
    stops.set(name, s)
  }
  const stop = s => { s.stopped = true; s.resolve() }
  const rl = require('readline').createInterface({ input: process.stdin })
  rl.on('line', line => {
    const w = line.trim().split(/\s+/)
    if (w.length === 2 && w[0] === 'stop' && stops.has(w[1])) stop(stops.get(w[1]))
  })
  rl.on('close', () => { for (const s of stops.values()) stop(s) })
  await Promise.all(roles.map(async ([name, f, spec]) => {
    try {
      await f(a, spec, stops.get(name))
    } catch (err) {
      emitError(name, err, true)
    }
    emit({ role: name, ev: 'done' })
  }))
  return []
}

function sleep (ms) {
  return new Promise(resolve => setTimeout(resolve, ms))
}

async function main () {
  const mode = process.argv[2]
  if (mode === 'stream') {
    // Runs until stopped: no watchdog, and its output is written as it comes.
    await stream(process.argv.slice(2))
    done = true
    await new Promise(resolve => process.stdout.write('', resolve))
    process.exit(0)
  }
  const a = parseFlags(process.argv.slice(2))
  const watchdog = WATCHDOG_MS + (mode === 'produce-steady' ? Number(a.duration) * 1000 || 0 : 0)
  setTimeout(() => {
    process.stderr.write(`client.js: still running after ${watchdog} ms, giving up\n`)
    process.exit(1)
  }, watchdog).unref()
  let out
  if (mode === 'produce') out = await produce(a)
  else if (mode === 'produce-steady') out = await produceSteady(a)
  else if (mode === 'consume') out = await consume(a)
  else usage(`unknown mode ${mode}`)
  const text = out.map(l => l + '\n').join('')
  await new Promise(resolve => process.stdout.write(text, resolve))
  done = true
  process.exit(0)
}

// If the event loop empties before main settles, something went silently wrong.
let done = false
process.on('exit', code => {
  if (!done && code === 0) {
    process.stderr.write('client.js: exited before finishing\n')
    process.exitCode = 1
  }
})

main().then(() => { done = true }, err => {
  process.stderr.write(`client.js: ${err && err.stack ? err.stack : err}\n`)
  process.exit(1)
})
