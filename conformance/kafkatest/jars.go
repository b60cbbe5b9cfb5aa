package kafkatest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
)

// kafkaVersion must match kafka.version in conformance/maven/pom.xml.
const kafkaVersion = "4.4.0"

// Versions are the broker versions WithVersion is tested with (the version
// matrix): each resolves from conformance/maven/broker/pom.xml into its own
// cache directory, <cache>/kafka-<version>. 2.8 runs with ZooKeeper only;
// 3.x with either; 4.x with KRaft only.
var Versions = []string{"2.8.2", "3.6.2", "3.9.1", kafkaVersion}

// completeMarker is written into the jar directory after a successful copy;
// it holds a hash of the pom the jars were resolved from.
const completeMarker = ".complete"

// Version returns the Apache Kafka version the harness runs.
func Version() string { return kafkaVersion }

// JarDir returns the directory holding Kafka's jars and their runtime
// dependencies, resolving them with Maven on first use. It fails the test if
// java or mvn is missing or resolution fails.
func JarDir(t testing.TB) string {
	t.Helper()
	dir, err := jarDir()
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	return dir
}

// Classpath returns a java -cp value covering every jar in JarDir.
func Classpath(t testing.TB) string {
	t.Helper()
	return JarDir(t) + "/*"
}

var jarOnce struct {
	sync.Mutex
	dirs map[string]string // version → resolved directory
}

// jarDir resolves the default version's jars once per process; failures
// are retried on the next call.
func jarDir() (string, error) { return jarDirFor(kafkaVersion) }

// jarDirFor resolves a version's jars once per process: the default from
// conformance/maven/pom.xml (tools and client programs included), any
// other from conformance/maven/broker/pom.xml with -Dkafka.version.
func jarDirFor(version string) (string, error) {
	jarOnce.Lock()
	defer jarOnce.Unlock()
	if d := jarOnce.dirs[version]; d != "" {
		return d, nil
	}
	if err := checkTools(); err != nil {
		return "", err
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "kafka-"+version)
	jar := "kafka_2.13-" + version + ".jar"
	if version == kafkaVersion {
		err = ResolveJars(filepath.Join(root, "conformance", "maven", "pom.xml"), dir, "Kafka", version, jar)
	} else {
		err = resolveJars(filepath.Join(root, "conformance", "maven", "broker", "pom.xml"), dir, "Kafka", version, jar, "-Dkafka.version="+version)
	}
	if err != nil {
		return "", err
	}
	if jarOnce.dirs == nil {
		jarOnce.dirs = make(map[string]string)
	}
	jarOnce.dirs[version] = dir
	return dir, nil
}

// checkTools fails with an installation hint when java or mvn is missing.
func checkTools() error {
	var missing []string
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%q not found in PATH; the real-Kafka harness needs a Java 17+ runtime and Maven: "+
			"install them with `apt-get install -y openjdk-17-jre-headless maven`", missing)
	}
	return nil
}

// ResolveJars copies the pom's runtime dependencies into dir unless dir is
// already complete for this pom, and checks that jar, the one that must be
// there, is. name and version (e.g. "Kafka", "4.4.0") say what is resolved,
// in errors. A flock on dir+".lock" serialises parallel test binaries and
// benchmarks.
func ResolveJars(pom, dir, name, version, jar string) error {
	return resolveJars(pom, dir, name, version, jar)
}

// resolveJars is ResolveJars with extra Maven arguments (properties the
// pom reads), which are part of what the completion marker hashes.
func resolveJars(pom, dir, name, version, jar string, mvnArgs ...string) error {
	pomBytes, err := os.ReadFile(pom)
	if err != nil {
		return fmt.Errorf("read %s pom: %w", name, err)
	}
	for _, a := range mvnArgs {
		pomBytes = append(pomBytes, "\n"+a...)
	}
	sum := sha256.Sum256(pomBytes)
	want := []byte(hex.EncodeToString(sum[:]) + "\n")
	if isComplete(dir, want) {
		return nil
	}

	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	unlock, err := lockFile(dir + ".lock")
	if err != nil {
		return err
	}
	defer unlock()
	if isComplete(dir, want) { // another process finished while we waited
		return nil
	}

	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	args := append([]string{"-q", "-B", "-f", pom, "dependency:copy-dependencies",
		"-DoutputDirectory=" + dir, "-DincludeScope=runtime"}, mvnArgs...)
	cmd := exec.Command("mvn", args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("resolving %s %s jars with Maven failed (%v); command: %s\n%s",
			name, version, err, cmd, out)
	}
	if _, err := os.Stat(filepath.Join(dir, jar)); err != nil {
		return fmt.Errorf("maven finished but %s has no %s", dir, jar)
	}
	return os.WriteFile(filepath.Join(dir, completeMarker), want, 0o644)
}

func isComplete(dir string, want []byte) bool {
	got, err := os.ReadFile(filepath.Join(dir, completeMarker))
	return err == nil && bytes.Equal(got, want)
}

// lockFile takes an exclusive flock on path, blocking until it is free.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// CacheDir is where the harness keeps what it downloads: $FERRY_CACHE,
// else <repo root>/.cache.
func CacheDir() (string, error) {
	if d := os.Getenv("FERRY_CACHE"); d != "" {
		return filepath.Abs(d)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".cache"), nil
}

// RepoRoot walks up to the directory holding go.mod, starting from this
// source file's directory (so it works from any package's tests), then
// from the working directory.
func RepoRoot() (string, error) {
	var starts []string
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, dir := range starts {
		for {
			if _, err := os.Stat(filepath.Join(dir, "conformance", "maven", "pom.xml")); err == nil {
				if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
					return dir, nil
				}
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", errors.New("cannot find the Ferry repo root (go.mod beside conformance/maven/pom.xml) above this package or the working directory")
}
