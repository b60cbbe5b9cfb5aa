package kafkatest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Class data sharing: a dynamic CDS archive of the classes a broker loads
// cuts a broker JVM's start-up CPU by about a third on this 2-core machine
// (2.2 s instead of 3.5 s to "Kafka Server started"). The archive is made
// once per cache and per java binary by starting a 1-node cluster with
// -XX:ArchiveClassesAtExit, doing a produce, and stopping it with SIGTERM.
// A JVM that cannot use the archive (java upgraded, jars changed) runs
// without it; FERRY_KAFKATEST_CDS=0 turns the archive off.

var cdsOnce struct {
	sync.Mutex
	paths map[string]string // jar directory → archive, "" when none
}

// cdsArgs are the JVM flags that use archive, if any. The archive's
// warnings are silenced so that a stale archive never writes to a tool's
// stdout.
func cdsArgs(archive string) []string {
	if archive == "" {
		return nil
	}
	return []string{"-XX:SharedArchiveFile=" + archive, "-Xlog:cds=off,cds+dynamic=off"}
}

// cdsArchive returns the path of the broker class archive for version's
// jars in jars, creating it on first use, or "" when it is off or cannot be
// made. Each version has its own archive (<jars>-cds), made by a cluster of
// that version: a JVM's archive is only valid for its class path.
func cdsArchive(version, jars string) string {
	cdsOnce.Lock()
	defer cdsOnce.Unlock()
	if path, done := cdsOnce.paths[jars]; done {
		return path
	}
	if cdsOnce.paths == nil {
		cdsOnce.paths = make(map[string]string)
	}
	cdsOnce.paths[jars] = ""
	if os.Getenv("FERRY_KAFKATEST_CDS") == "0" {
		return ""
	}
	path, err := makeCDSArchive(version, jars)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kafkatest: running Kafka %s without a class data sharing archive: %v\n", version, err)
		return ""
	}
	cdsOnce.paths[jars] = path
	return path
}

func makeCDSArchive(version, jars string) (string, error) {
	key, err := cdsKey(jars)
	if err != nil {
		return "", err
	}
	dir := jars + "-cds"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	archive := filepath.Join(dir, key+".jsa")
	failed := filepath.Join(dir, key+".failed")
	if _, err := os.Stat(archive); err == nil {
		return archive, nil
	}
	unlock, err := lockFile(filepath.Join(dir, "lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(archive); err == nil {
		return archive, nil
	}
	if b, err := os.ReadFile(failed); err == nil {
		return "", fmt.Errorf("an earlier attempt failed (remove %s to retry): %s", failed, b)
	}
	start := time.Now()
	if err := dumpCDSArchive(version, jars, archive); err != nil {
		_ = os.WriteFile(failed, []byte(err.Error()), 0o644)
		return "", err
	}
	fmt.Fprintf(os.Stderr, "kafkatest: made class data sharing archive %s in %v\n", archive, time.Since(start).Round(time.Millisecond))
	return archive, nil
}

// cdsKey identifies the java binary and the jar set an archive is valid for.
func cdsKey(jars string) (string, error) {
	java, err := exec.LookPath("java")
	if err != nil {
		return "", err
	}
	if java, err = filepath.EvalSymlinks(java); err != nil {
		return "", err
	}
	st, err := os.Stat(java)
	if err != nil {
		return "", err
	}
	marker, err := os.ReadFile(filepath.Join(jars, completeMarker))
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%d\n%d\n%s\n%s\n", java, st.Size(), st.ModTime().UnixNano(), jars, marker)
	return "broker-" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// dumpCDSArchive runs a 1-node cluster that writes its class list to a
// temporary archive at exit, then moves the archive into place: KRaft where
// the version has it, else ZooKeeper.
func dumpCDSArchive(version, jars, archive string) error {
	tmp := fmt.Sprintf("%s.tmp-%d", archive, os.Getpid())
	defer os.Remove(tmp)
	cfg := Config{Brokers: 1, Name: "cds-archive", Version: version, ZooKeeper: !hasKRaft(version)}
	c, err := newCluster(cfg, jars, "", tmp)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := exerciseBroker(c.Bootstrap()); err != nil {
		return fmt.Errorf("exercising the broker: %w", err)
	}
	if err := c.Stop(1); err != nil {
		return err
	}
	if st, err := os.Stat(tmp); err != nil || st.Size() == 0 {
		return fmt.Errorf("JVM wrote no archive (%v); log tail:\n%s", err, c.LogTail(30))
	}
	return os.Rename(tmp, archive)
}

// exerciseBroker loads the broker's request paths: create a topic, produce
// and fetch a record.
func exerciseBroker(bootstrap string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.ConsumeTopics("cds"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DefaultProduceTopic("cds"))
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "cds"); err != nil {
		return err
	}
	if err := cl.ProduceSync(ctx, kgo.StringRecord("x")).FirstErr(); err != nil {
		return err
	}
	fs := cl.PollFetches(ctx)
	if err := fs.Err0(); err != nil {
		return err
	}
	return nil
}
