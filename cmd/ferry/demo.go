package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"text/template"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// The demo's fixed names.
const (
	demoClusterID  = "ferry-demo"
	demoPrimary    = "primary"
	demoStandby    = "standby"
	demoTopic      = "demo"
	demoPartitions = 3
)

type demoFlags struct {
	listen   string
	admin    string
	logLevel string
}

func parseDemoFlags(args []string, stderr io.Writer) (*demoFlags, error) {
	var f demoFlags
	fs := flag.NewFlagSet("ferry demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.listen, "listen", "127.0.0.1:9092", "Kafka listener `host:port` (port 0: any free port)")
	fs.StringVar(&f.admin, "admin", "127.0.0.1:9644", "admin API `host:port` (port 0: any free port)")
	fs.StringVar(&f.logLevel, "log-level", "warn", "debug, info, warn or error (logs go to stderr)")
	setUsage(fs, stderr, "Usage: ferry demo [--listen HOST:PORT] [--admin HOST:PORT] [--log-level LEVEL]")
	if err := parseArgs(fs, "demo", args); err != nil {
		return nil, err
	}
	return &f, nil
}

// demo is Ferry's main job on an embedded default: two in-process Kafka
// clusters (kfake) and one Ferry member in front of them, primary active,
// mirroring primary → standby. Each step is a method, run in order by
// demoCmd; the guide it prints ends with the switchover.
type demo struct {
	flags            *demoFlags
	log              *zap.Logger
	primary, standby *kfake.Cluster
	node             *node
}

func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseDemoFlags(args, stderr)
	if err != nil {
		return flagsError(err)
	}
	log, err := newLogger(f.logLevel)
	if err != nil {
		return usageError{fmt.Errorf("--log-level: %w", err)}
	}
	defer log.Sync() //nolint:errcheck // stderr cannot always sync

	d := &demo{flags: f, log: log}
	defer d.Close()
	if err := d.startClusters(); err != nil {
		return err
	}
	if err := d.startFerry(ctx); err != nil {
		return stoppedEarly(ctx, err)
	}
	if err := d.createTopic(ctx); err != nil {
		return stoppedEarly(ctx, err)
	}
	if err := d.waitMirrored(ctx); err != nil {
		return stoppedEarly(ctx, err)
	}
	if err := d.printGuide(stdout); err != nil {
		return err
	}
	err = d.node.wait(ctx)
	fmt.Fprintln(stdout, "\nStopping the demo.")
	return err
}

// stoppedEarly is err, unless the demo was stopped (Ctrl-C) while starting.
func stoppedEarly(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// startClusters starts the two physical clusters, three brokers each.
func (d *demo) startClusters() (err error) {
	if d.primary, err = kfake.NewCluster(kfake.NumBrokers(3), kfake.ClusterID("demo-"+demoPrimary)); err != nil {
		return fmt.Errorf("starting the %s cluster: %w", demoPrimary, err)
	}
	if d.standby, err = kfake.NewCluster(kfake.NumBrokers(3), kfake.ClusterID("demo-"+demoStandby)); err != nil {
		return fmt.Errorf("starting the %s cluster: %w", demoStandby, err)
	}
	return nil
}

// startFerry starts a Ferry member in front of both clusters, primary
// active at generation 0.
func (d *demo) startFerry(ctx context.Context) error {
	cfg := &Config{
		ClusterID:   demoClusterID,
		Listen:      d.flags.listen,
		AdminListen: d.flags.admin,
		Clusters: []ClusterConfig{
			{Name: demoPrimary, Bootstrap: d.primary.ListenAddrs()},
			{Name: demoStandby, Bootstrap: d.standby.ListenAddrs()},
		},
		Active:   demoPrimary,
		LogLevel: d.flags.logLevel,
		// The mirror is on by default with two clusters; a short sync
		// interval makes a topic created in the demo appear on the
		// standby within a second.
		Mirror: MirrorConfig{SyncInterval: time.Second},
	}
	cfg.applyDefaults(func() (string, error) { return "127.0.0.1", nil })
	if err := cfg.validate(); err != nil {
		return usageError{err}
	}
	n, err := newNode(cfg, d.log)
	if err != nil {
		return err
	}
	d.node = n
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return n.start(startCtx)
}

// createTopic creates the demo topic through Ferry, as a client would.
func (d *demo) createTopic(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(d.node.bootstrap))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, demoPartitions, 3, nil, demoTopic); err != nil {
		return fmt.Errorf("creating topic %q through Ferry: %w", demoTopic, err)
	}
	return nil
}

// waitMirrored waits until the mirror has created the demo topic on the
// standby and copied it (it is empty, so that is quick).
func (d *demo) waitMirrored(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.node.mirror.WaitCaughtUp(ctx, demoTopic); err != nil {
		return fmt.Errorf("mirroring topic %q to the %s cluster: %w", demoTopic, demoStandby, err)
	}
	return nil
}

var guide = template.Must(template.New("guide").Parse(`
Ferry demo is running: one virtual Kafka cluster in front of two in-process ones.

  Kafka bootstrap: {{.Bootstrap}}
  Admin API:       http://{{.Admin}}/status
  Cluster ID:      {{.ClusterID}} (virtual; clients see only Ferry)
  Routing:         {{.Routing}}
  Clusters:        {{.Primary}} (active)  {{.PrimaryAddrs}}
                   {{.Standby}}           {{.StandbyAddrs}}
  Mirror:          {{.Primary}} → {{.Standby}}, every record at the same offset
  Topic:           {{.Topic}} ({{.Partitions}} partitions, created through Ferry, mirrored)

Try it with a real client:

  kcat -b {{.Bootstrap}} -L
  echo 'hello ferry' | kcat -b {{.Bootstrap}} -t {{.Topic}} -P
  kcat -b {{.Bootstrap}} -t {{.Topic}} -C -e -f '%p/%o %s\n'

  kafka-console-producer.sh --bootstrap-server {{.Bootstrap}} --topic {{.Topic}}
  kafka-console-consumer.sh --bootstrap-server {{.Bootstrap}} --topic {{.Topic}} --from-beginning

  curl -s http://{{.Admin}}/status
  curl -s http://{{.Admin}}/metrics | grep ^ferry_requests_total

Watch the mirror: per-partition state, mirrored end offset, lag in records
and seconds (also in /status), and its metrics:

  curl -s http://{{.Admin}}/status/mirror
  curl -s http://{{.Admin}}/metrics | grep ^ferry_mirror_lag

Read the {{.Standby}} cluster directly, not through Ferry: the same records
at the same offsets as on {{.Primary}}:

  Standby direct:  {{.StandbyFirst}}
  kcat -b {{.StandbyFirst}} -t {{.Topic}} -C -e -f '%p/%o %s\n'

Switch the active cluster with one call. Clients stay connected to Ferry:
writes are held while the mirror drains, then go to {{.Standby}}; a consumer
group resumes at the offsets it committed. Run a group consumer in another
terminal first, to watch it carry on:

  kcat -b {{.Bootstrap}} -G demo-group {{.Topic}} -f '%p/%o %s\n'
  ferry switchover --admin {{.Admin}} --to {{.Standby}}
  ferry status --admin {{.Admin}}
  echo 'after the switch' | kcat -b {{.Bootstrap}} -t {{.Topic}} -P

and back again (the mirror now runs {{.Standby}} → {{.Primary}}, so the
records written meanwhile are there, at the same offsets):

  ferry switchover --admin {{.Admin}} --to {{.Primary}}

A franz-go example is in README.md ("Quickstart"). Ctrl-C stops the demo.
`))

// printGuide prints the addresses and what to try.
func (d *demo) printGuide(w io.Writer) error {
	return guide.Execute(w, map[string]any{
		"Bootstrap":    d.node.bootstrap,
		"Admin":        displayAddr(d.node.adminLn.Addr()),
		"ClusterID":    demoClusterID,
		"Routing":      d.node.routes.Current(),
		"Primary":      demoPrimary,
		"PrimaryAddrs": strings.Join(d.primary.ListenAddrs(), ","),
		"Standby":      demoStandby,
		"StandbyAddrs": strings.Join(d.standby.ListenAddrs(), ","),
		"StandbyFirst": d.standby.ListenAddrs()[0],
		"Topic":        demoTopic,
		"Partitions":   demoPartitions,
	})
}

// displayAddr is an address to connect to: an unspecified host becomes
// 127.0.0.1.
func displayAddr(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok || !ta.IP.IsUnspecified() {
		return a.String()
	}
	return fmt.Sprintf("127.0.0.1:%d", ta.Port)
}

// Close stops Ferry, then the clusters.
func (d *demo) Close() {
	if d.node != nil {
		d.node.Close()
	}
	if d.primary != nil {
		d.primary.Close()
	}
	if d.standby != nil {
		d.standby.Close()
	}
}
