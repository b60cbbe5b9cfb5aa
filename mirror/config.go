package mirror

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol/clusterauth"
)

// Option configures a Mirror.
type Option func(*config)

type config struct {
	source, target []string // bootstrap addresses
	// srcSec and dstSec are the clusters' TLS and SASL (nil: plaintext).
	srcSec, dstSec *clusterauth.Security

	topicInclude, topicExclude []*regexp.Regexp
	groupInclude, groupExclude []*regexp.Regexp

	syncInterval time.Duration
	inflight     int
	txnSlots     int
	fetchMaxWait time.Duration
	idleWait     time.Duration // a fetch wait that parks (idleFetchMaxWait; tests shorten it)
	connBudget   int           // ConnectionBudget (0: none)
	fetchBytes   int32
	syncGroups   bool
	syncACLs     bool
	idPrefix     string
	fencePeriod  time.Duration // see fence.go
	recompress   bool          // see reframe.go
	ownership    Ownership     // nil: every partition, and the sync loop
	endsInterval time.Duration // see ends.go
	// parkedListEvery: one end listing in this many names the parked
	// partitions too (ends.go; tests shorten it).
	parkedListEvery int
	// deafWatcher, in tests, makes the watchers wake no writer on a
	// change: a watcher that missed one.
	deafWatcher bool
	// gate, when set, is asked before every append (WithWriteGate).
	gate func() bool
	// syncGate, when set, is asked before the sync loop writes on the
	// standby (WithSyncGate).
	syncGate func() bool
	// groupGate, when set, is asked too before the sync loop copies a
	// group's offsets (WithGroupSyncGate).
	groupGate func() bool
	// carrier, when set, names the open transactions Ferry carries
	// (WithTxnCarrier); nil: every one on a mirrored partition.
	carrier TxnCarrier

	errs []error // from options, reported by validate

	// srcHooks and dstHooks are added to the clients of the source and the
	// target (tests count their requests).
	srcHooks, dstHooks []kgo.Hook
	// onFetch, when set, is told of each copy fetch a writer sends and its
	// wait (tests).
	onFetch func(topic string, partition int32, wait time.Duration)
	// onWatch, when set, is told of each request a watcher sends (tests).
	onWatch func(req *kmsg.FetchRequest)

	logger   *zap.Logger
	registry prometheus.Registerer
}

func defaultConfig() config {
	return config{
		syncInterval:    5 * time.Second,
		inflight:        128,
		txnSlots:        4,
		fetchMaxWait:    500 * time.Millisecond,
		idleWait:        idleFetchMaxWait,
		fetchBytes:      8 << 20,
		syncGroups:      true,
		syncACLs:        true,
		idPrefix:        DefaultTransactionalIDPrefix,
		fencePeriod:     2 * time.Second,
		recompress:      true,
		endsInterval:    defaultEndsInterval,
		parkedListEvery: 30,
		logger:          zap.NewNop(),
	}
}

// Source sets the bootstrap addresses of the cluster mirrored from (the
// active cluster).
func Source(addrs ...string) Option {
	return func(c *config) { c.source = splitAddrs(addrs) }
}

// Target sets the bootstrap addresses of the cluster mirrored to (the
// standby cluster).
func Target(addrs ...string) Option {
	return func(c *config) { c.target = splitAddrs(addrs) }
}

// SourceSecurity sets how the mirror connects to the source cluster (TLS,
// SASL), for its franz-go client and its writers' raw connections alike.
func SourceSecurity(s *clusterauth.Security) Option { return func(c *config) { c.srcSec = s } }

// TargetSecurity sets how the mirror connects to the target cluster.
func TargetSecurity(s *clusterauth.Security) Option { return func(c *config) { c.dstSec = s } }

func splitAddrs(addrs []string) []string {
	var out []string
	for _, a := range addrs {
		for _, s := range strings.Split(a, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// Topics restricts mirroring to topics matching one of the include
// patterns (default: all) and none of the exclude patterns. Internal topics
// and topics whose name starts with "__" are never mirrored.
func Topics(include, exclude []string) Option {
	return func(c *config) {
		c.topicInclude = append(c.topicInclude, c.compileAll(include)...)
		c.topicExclude = append(c.topicExclude, c.compileAll(exclude)...)
	}
}

// Groups restricts the consumer groups whose offsets are copied, like
// Topics.
func Groups(include, exclude []string) Option {
	return func(c *config) {
		c.groupInclude = append(c.groupInclude, c.compileAll(include)...)
		c.groupExclude = append(c.groupExclude, c.compileAll(exclude)...)
	}
}

// compileAll compiles anchored patterns; a bad pattern is kept as one that
// matches nothing and reported by validate.
func (c *config) compileAll(pats []string) []*regexp.Regexp {
	var out []*regexp.Regexp
	for _, p := range pats {
		re, err := regexp.Compile("^(?:" + p + ")$")
		if err != nil {
			c.errs = append(c.errs, fmt.Errorf("pattern %q: %w", p, err))
			continue
		}
		out = append(out, re)
	}
	return out
}

// SyncInterval sets how often topics, configs, group offsets and ACLs are
// synchronised (default 5s).
func SyncInterval(d time.Duration) Option { return func(c *config) { c.syncInterval = d } }

// InFlight sets how many Produce requests a partition writer keeps in
// flight on its connection to the standby leader (default 128, at most
// MaxInFlight). The broker reads a connection's requests one at a time, in
// order, so the depth changes nothing of where batches land; it hides the
// round trip to a standby far away: a writer appends at most InFlight
// batches per round trip (mirrorbench -rtts, 16 KiB batches, 4 partitions:
// at 100 ms, 5 in flight copied 2.4 MB/s, 32 14.8 MB/s, 64 27.7 MB/s and
// 128 48.1 MB/s, the copy at 0 ms 42–45 MB/s). It is no retry window: the
// writer never sends a batch twice in a session (any error or lost answer
// ends the session, and the next one starts from the standby's end under a
// new producer epoch), so the five batches a broker deduplicates per
// producer do not bound it. What is in flight is at most one fetch's
// batches (8 MiB).
func InFlight(n int) Option { return func(c *config) { c.inflight = n } }

// MaxInFlight bounds InFlight.
const MaxInFlight = 256

// FetchMaxWait sets how long a source fetch waits for new data (default
// 500ms); after fetches that return nothing the wait doubles, up to 10 s
// (idleFetchMaxWait), and is back to this after one that returns records.
func FetchMaxWait(d time.Duration) Option { return func(c *config) { c.fetchMaxWait = d } }

// ConnectionBudget bounds, softly, the broker connections the mirror holds
// (default 0: no bound). Each partition's writer holds two (to the source
// and the standby leader) while it copies, and keeps them through up to
// 15 s of long-polling fetches after it caught up, in case more comes,
// before it parks (idleFetchMaxWait); a parked partition holds none. Past
// the budget, a writer that has caught up parks at once: when many
// partitions get a write together (a member starting, a burst over every
// partition), the connections stay near the budget plus the writers still
// copying, instead of two per partition written to in the last 15 s,
// which at 10,000 partitions is more descriptors than a process is often
// allowed. Its cost: a partition woken again soon after dials again.
func ConnectionBudget(n int) Option { return func(c *config) { c.connBudget = n } }

// SyncGroups enables or disables copying consumer group offsets (default on).
func SyncGroups(on bool) Option { return func(c *config) { c.syncGroups = on } }

// SyncACLs enables or disables copying ACLs (default on).
func SyncACLs(on bool) Option { return func(c *config) { c.syncACLs = on } }

// RecompressCompacted sets what happens to a compressed source batch that
// the log cleaner left with holes inside it, which a broker refuses as it
// is (default on): on, it is split into runs of consecutive records, each
// compressed again with the batch's codec (the only batches the mirror
// re-encodes; ferry_mirror_recompressed_batches_total); off, the partition
// halts with ErrUnsupportedBatch.
func RecompressCompacted(on bool) Option { return func(c *config) { c.recompress = on } }

// Logger sets the logger (default: none).
func Logger(l *zap.Logger) Option { return func(c *config) { c.logger = l } }

// Registerer sets where metrics are registered (default: nowhere).
func Registerer(r prometheus.Registerer) Option { return func(c *config) { c.registry = r } }

func (c *config) validate() error {
	var errs []error
	errs = append(errs, c.errs...)
	if len(c.source) == 0 {
		errs = append(errs, errors.New("no source bootstrap addresses (Source)"))
	}
	if len(c.target) == 0 {
		errs = append(errs, errors.New("no target bootstrap addresses (Target)"))
	}
	if c.endsInterval <= 0 {
		errs = append(errs, fmt.Errorf("ends interval %v is not positive", c.endsInterval))
	}
	if c.syncInterval <= 0 {
		errs = append(errs, fmt.Errorf("sync interval %v is not positive", c.syncInterval))
	}
	if c.inflight < 1 || c.inflight > MaxInFlight {
		errs = append(errs, fmt.Errorf("in-flight depth %d outside 1..%d", c.inflight, MaxInFlight))
	}
	if c.txnSlots < 1 {
		errs = append(errs, fmt.Errorf("transaction slots %d, need at least 1", c.txnSlots))
	}
	if c.logger == nil {
		errs = append(errs, errors.New("nil logger"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("mirror: invalid config: %w", err)
	}
	return nil
}

// mirrorTopic reports whether a topic is selected.
func (c *config) mirrorTopic(name string, internal bool) bool {
	if internal || strings.HasPrefix(name, "__") {
		return false
	}
	return matches(name, c.topicInclude, c.topicExclude)
}

func (c *config) mirrorGroup(name string) bool {
	return matches(name, c.groupInclude, c.groupExclude)
}

func matches(name string, include, exclude []*regexp.Regexp) bool {
	ok := len(include) == 0
	for _, re := range include {
		if re.MatchString(name) {
			ok = true
			break
		}
	}
	for _, re := range exclude {
		if re.MatchString(name) {
			return false
		}
	}
	return ok
}
