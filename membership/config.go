package membership

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
)

// Config is how a member takes part in the fleet's gossip.
type Config struct {
	// Bind is the gossip host:port, UDP and TCP; default "0.0.0.0:7946".
	// Port 0 picks a free port.
	Bind string
	// Advertise is the host:port the others reach this member at, when
	// not the bound one (NAT, 0.0.0.0: memberlist then picks a private
	// address of this host).
	Advertise string
	// Seeds are members to join: host:port entries, or a DNS name with a
	// port that resolves to several addresses (a headless service). They
	// are resolved again at every attempt, and this member's own address
	// is skipped.
	Seeds []string
	// Key encrypts and authenticates the gossip and the calls between
	// members (16, 24 or 32 bytes: AES-128, -192, -256; see LoadKey).
	// Nil gossips in plaintext, which anyone who reaches the port can join.
	Key []byte

	// Profile picks memberlist's timings: "lan" (the default,
	// memberlist.DefaultLANConfig) or "local" (DefaultLocalConfig, for a
	// fleet on one host). The fields below override single timings; zero
	// keeps the profile's.
	Profile             string
	ProbeInterval       time.Duration
	ProbeTimeout        time.Duration
	SuspicionMult       int
	GossipInterval      time.Duration
	PushPullInterval    time.Duration
	GossipToTheDeadTime time.Duration
	TCPTimeout          time.Duration

	// JoinBackoff and JoinBackoffMax bound the wait between attempts to
	// join the seeds (default 1s doubling up to 30s).
	JoinBackoff    time.Duration
	JoinBackoffMax time.Duration
	// RejoinInterval is how often a joined member that misses a seed among
	// its live members joins it again (default 10s).
	RejoinInterval time.Duration
	// LeaveTimeout bounds how long Close waits for the leave to be
	// gossiped (default 2s).
	LeaveTimeout time.Duration

	// Transport, when set, carries the gossip in place of one bound on
	// Bind: a CutTransport, for fault injection only.
	Transport *CutTransport
}

const (
	defaultBind           = "0.0.0.0:7946"
	defaultJoinBackoff    = time.Second
	defaultJoinBackoffMax = 30 * time.Second
	defaultRejoinInterval = 10 * time.Second
	defaultLeaveTimeout   = 2 * time.Second
	// label is sent with every packet and stream: members of another
	// memberlist pool on the same port (serf defaults to 7946 too) are
	// not merged with the fleet.
	label = "ferry"
	// deadNodeReclaimTime lets a member that comes back at a new address
	// (a new pod IP) take its node ID as soon as its old entry is dead;
	// memberlist's default, 0, refuses until the dead entry is forgotten
	// (GossipToTheDeadTime, 30s on a LAN).
	deadNodeReclaimTime = time.Nanosecond
)

func (c *Config) withDefaults() Config {
	d := *c
	if d.Bind == "" {
		d.Bind = defaultBind
	}
	if d.JoinBackoff <= 0 {
		d.JoinBackoff = defaultJoinBackoff
	}
	if d.JoinBackoffMax < d.JoinBackoff {
		d.JoinBackoffMax = max(defaultJoinBackoffMax, d.JoinBackoff)
	}
	if d.RejoinInterval <= 0 {
		d.RejoinInterval = defaultRejoinInterval
	}
	if d.LeaveTimeout <= 0 {
		d.LeaveTimeout = defaultLeaveTimeout
	}
	return d
}

// DefaultPushPullInterval is how often a member exchanges its whole state
// with another (memberlist's LAN profile says 30 s). A member's metadata
// update (its generation, its lanes) is broadcast, but hashicorp/memberlist
// v0.7.0's broadcast queue can drop it (hashicorp/memberlist#263), and then
// only the next push-pull carries it: 5 s bounds how late that can be, at
// the cost of one small TCP exchange per member every 5 s.
const DefaultPushPullInterval = 5 * time.Second

// memberlistConfig is the memberlist configuration of cfg (defaults
// applied), less the delegates and logger.
func memberlistConfig(cfg Config, name string) (*memberlist.Config, error) {
	var mc *memberlist.Config
	switch cfg.Profile {
	case "", "lan":
		mc = memberlist.DefaultLANConfig()
	case "local":
		mc = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("unknown gossip profile %q (want lan or local)", cfg.Profile)
	}
	mc.Name = name
	host, port, err := splitHostPort(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("bind address: %v", err)
	}
	mc.BindAddr, mc.BindPort = host, port
	// memberlist advertises the bound port unless told otherwise; with
	// port 0 it advertises the one it picked.
	mc.AdvertisePort = port
	if cfg.Advertise != "" {
		host, port, err := splitHostPort(cfg.Advertise)
		if err != nil {
			return nil, fmt.Errorf("advertise address: %v", err)
		}
		if net.ParseIP(host) == nil {
			return nil, fmt.Errorf("advertise address %q: want an IP address", cfg.Advertise)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = host, port
	}
	if cfg.Transport != nil {
		mc.Transport = cfg.Transport
		if mc.BindPort == 0 {
			mc.BindPort = cfg.Transport.Port()
		}
		if cfg.Advertise == "" {
			mc.AdvertisePort = mc.BindPort
		}
	}
	if cfg.Key != nil {
		kr, err := memberlist.NewKeyring(nil, cfg.Key)
		if err != nil {
			return nil, fmt.Errorf("gossip key: %v", err)
		}
		mc.Keyring = kr
	}
	mc.Label = label
	mc.DeadNodeReclaimTime = deadNodeReclaimTime
	setDur := func(dst *time.Duration, v time.Duration) {
		if v > 0 {
			*dst = v
		}
	}
	setDur(&mc.ProbeInterval, cfg.ProbeInterval)
	setDur(&mc.ProbeTimeout, cfg.ProbeTimeout)
	setDur(&mc.GossipInterval, cfg.GossipInterval)
	if cfg.Profile != "local" {
		mc.PushPullInterval = DefaultPushPullInterval
	}
	setDur(&mc.PushPullInterval, cfg.PushPullInterval)
	setDur(&mc.GossipToTheDeadTime, cfg.GossipToTheDeadTime)
	setDur(&mc.TCPTimeout, cfg.TCPTimeout)
	if cfg.SuspicionMult > 0 {
		mc.SuspicionMult = cfg.SuspicionMult
	}
	if mc.ProbeTimeout >= mc.ProbeInterval {
		return nil, fmt.Errorf("probe timeout %v must be shorter than the probe interval %v", mc.ProbeTimeout, mc.ProbeInterval)
	}
	return mc, nil
}

func splitHostPort(hp string) (string, int, error) {
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port in %q: %v", hp, err)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, int(port), nil
}

// LoadKey reads a gossip key from a file holding it in base64 (as `serf
// keygen` or `openssl rand -base64 32` print it); whitespace is ignored.
func LoadKey(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	text := bytes.Join(bytes.Fields(raw), nil)
	if len(text) == 0 {
		return nil, fmt.Errorf("gossip key file %s is empty", path)
	}
	key := make([]byte, base64.StdEncoding.DecodedLen(len(text)))
	n, err := base64.StdEncoding.Decode(key, text)
	if err != nil {
		return nil, fmt.Errorf("gossip key file %s: not base64: %v", path, err)
	}
	key = key[:n]
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("gossip key file %s: the key is %d bytes, want 16, 24 or 32 (e.g. `openssl rand -base64 32`)", path, len(key))
}
