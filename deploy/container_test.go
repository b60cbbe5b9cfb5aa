package deploy

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-gw/ferry/internal/testwait"
)

// The image the test builds, and the builder image it makes from the host's
// Go toolchain: no registry is needed (nor reachable where this was written).
const (
	testImage   = "localhost/ferry:test"
	builderRepo = "localhost/ferry-builder"
	imageUser   = "65532:65532"
)

// cacheDir is $FERRY_CACHE, else the repository's .cache (as the Kafka jars'
// harness has it): the container storage lives there, outside what go list
// and gofmt look at and what .dockerignore sends as the build context.
func cacheDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("FERRY_CACHE"); d != "" {
		abs, err := filepath.Abs(d)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	abs, err := filepath.Abs("../.cache")
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// tool returns the path of a program the test needs, failing the test in
// CI (conformance/clients/install.sh installs it) and skipping it elsewhere.
func tool(t *testing.T, name, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not installed (CI=true): run conformance/clients/install.sh, or %s: %v", name, install, err)
	}
	t.Skipf("%s is not installed; %s (conformance/clients/install.sh does)", name, install)
	return ""
}

// buildah runs buildah on the test's own storage under the cache directory,
// chroot isolation (no container runtime, no user namespaces needed).
type buildah struct {
	bin  string
	root string
}

func newBuildah(t *testing.T) *buildah {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("buildah with chroot isolation and overlay storage needs root here")
	}
	b := &buildah{
		bin:  tool(t, "buildah", "apt-get install --no-install-recommends buildah"),
		root: filepath.Join(cacheDir(t), "containers"),
	}
	if err := os.MkdirAll(filepath.Join(b.root, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *buildah) cmd(ctx context.Context, args ...string) *exec.Cmd {
	global := []string{"--root", filepath.Join(b.root, "storage"), "--runroot", filepath.Join(b.root, "run")}
	c := exec.CommandContext(ctx, b.bin, append(global, args...)...)
	// buildah keeps RUN --mount=type=cache directories (Go's module and
	// build caches) under TMPDIR: there they survive for the next build.
	c.Env = append(os.Environ(), "TMPDIR="+filepath.Join(b.root, "tmp"))
	return c
}

// run runs buildah and returns its standard output, failing the test on an
// error.
func (b *buildah) run(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := b.cmd(ctx, args...)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		t.Fatalf("buildah %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return strings.TrimSpace(string(out))
}

// ensureBuilder makes the builder image from the host's Go toolchain unless
// it exists: GOROOT, /bin/sh with the libraries it loads, CA certificates
// and /tmp, on an empty base. It stands in for golang:1.26-bookworm, which
// the Dockerfile uses by default.
func (b *buildah) ensureBuilder(t *testing.T) string {
	t.Helper()
	image := builderRepo + ":" + runtime.Version()
	if b.cmd(context.Background(), "inspect", "--type", "image", image).Run() == nil {
		return image
	}
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	files := map[string]string{
		strings.TrimSpace(string(goroot)):    "/usr/local/go",
		"/etc/ssl/certs/ca-certificates.crt": "/etc/ssl/certs/ca-certificates.crt",
	}
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	files[sh] = "/bin/sh"
	for _, lib := range sharedLibs(t, sh) {
		files[lib] = lib
	}
	tmp := t.TempDir()
	if err := os.Chmod(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	files[tmp] = "/tmp"

	ctr := b.run(t, "from", "scratch")
	defer b.run(t, "rm", ctr)
	for src, dst := range files {
		b.run(t, "copy", "--quiet", ctr, src, dst)
	}
	b.run(t, "config", "--env", "PATH=/usr/local/go/bin:/go/bin:/usr/bin:/bin", "--env", "GOPATH=/go",
		"--env", "GOTOOLCHAIN=local", "--env", "HOME=/root", ctr)
	b.run(t, "commit", "--quiet", ctr, image)
	return image
}

// sharedLibs lists the libraries, and the loader, that ldd says bin loads.
func sharedLibs(t *testing.T, bin string) []string {
	t.Helper()
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil
		}
		t.Fatalf("ldd %s: %v\n%s", bin, err, out)
	}
	var libs []string
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") {
			libs = append(libs, f)
		}
	}
	return libs
}

// imageConfig is the part of an OCI image configuration the test checks.
type imageConfig struct {
	User         string              `json:"User"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts"`
	Entrypoint   []string            `json:"Entrypoint"`
	Cmd          []string            `json:"Cmd"`
}

// TestContainerImage builds the Dockerfile with buildah, checks the image's
// configuration and contents, and runs its binary from the image's root
// file system as the image's user: version, the default command without a
// configuration, and `ferry demo` answering /healthz and /readyz.
func TestContainerImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a container image (-short)")
	}
	b := newBuildah(t)
	builder := b.ensureBuilder(t)

	// The build reads modules from the host's module cache through a
	// file:// proxy: the same bytes go.sum names, and no network.
	if out, err := exec.Command("go", "mod", "download").CombinedOutput(); err != nil {
		t.Fatalf("go mod download: %v\n%s", err, out)
	}
	modcache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	b.run(t, "build", "--quiet", "--isolation", "chroot", "--network", "host",
		"--volume", strings.TrimSpace(string(modcache))+"/cache/download:/goproxy:ro",
		"--build-arg", "BUILDER="+builder,
		"--build-arg", "GOPROXY=file:///goproxy", "--build-arg", "GOSUMDB=off",
		"--build-arg", "VERSION=container-test",
		"-t", testImage, "..")
	t.Logf("buildah build: %s", time.Since(start).Round(100*time.Millisecond))
	// Each build leaves the previous test image untagged: drop those.
	t.Cleanup(func() { _ = b.cmd(context.Background(), "rmi", "--prune").Run() })

	cfg := inspectImage(t, b)
	ctr := b.run(t, "from", "--pull=never", testImage)
	t.Cleanup(func() { _ = b.cmd(context.Background(), "rm", ctr).Run() })
	checkRootfs(t, b, ctr)

	out, code := runInImage(t, b, ctr, cfg.Entrypoint[0], "version")
	if code != 0 || strings.TrimSpace(out) != "ferry container-test" {
		t.Errorf("ferry version in the image: exit %d, %q; want ferry container-test", code, out)
	}
	// The default command without a mounted configuration: exit 2, saying so.
	out, code = runInImage(t, b, ctr, append(cfg.Entrypoint, cfg.Cmd...)...)
	if code != 2 || !strings.Contains(out, "/etc/ferry/ferry.yaml: no such file or directory") {
		t.Errorf("the image's default command with no configuration: exit %d, %q; want 2 and the missing file named", code, out)
	}
	demoInImage(t, b, ctr, cfg.Entrypoint[0])
}

// inspectImage checks the image's user, entry point, command and ports.
func inspectImage(t *testing.T, b *buildah) imageConfig {
	t.Helper()
	var img struct {
		OCIv1 struct {
			Config imageConfig `json:"config"`
		} `json:"OCIv1"`
	}
	if err := json.Unmarshal([]byte(b.run(t, "inspect", "--type", "image", testImage)), &img); err != nil {
		t.Fatalf("buildah inspect: %v", err)
	}
	cfg := img.OCIv1.Config
	if cfg.User != imageUser {
		t.Errorf("image user %q, want %s (non-root)", cfg.User, imageUser)
	}
	if !slices.Equal(cfg.Entrypoint, []string{"/usr/local/bin/ferry"}) {
		t.Fatalf("entrypoint %q, want [/usr/local/bin/ferry]", cfg.Entrypoint)
	}
	if want := []string{"serve", "--config", "/etc/ferry/ferry.yaml"}; !slices.Equal(cfg.Cmd, want) {
		t.Errorf("cmd %q, want %q", cfg.Cmd, want)
	}
	for _, p := range []string{"9092/tcp", "9644/tcp", "7946/tcp", "7946/udp"} {
		if _, ok := cfg.ExposedPorts[p]; !ok {
			t.Errorf("port %s is not exposed (have %v)", p, cfg.ExposedPorts)
		}
	}
	return cfg
}

// checkRootfs mounts the container's root file system and checks what the
// image holds: a static binary, CA certificates, the non-root user, and
// not much else.
func checkRootfs(t *testing.T, b *buildah, ctr string) {
	t.Helper()
	root := b.run(t, "mount", ctr)
	defer b.run(t, "umount", ctr)

	f, err := elf.Open(filepath.Join(root, "usr/local/bin/ferry"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("/usr/local/bin/ferry has a %s program header: not a static binary", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("/usr/local/bin/ferry needs shared libraries %v", libs)
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil || !regexp.MustCompile(`(?m)^nonroot:x:65532:65532:`).Match(passwd) {
		t.Errorf("/etc/passwd has no nonroot user 65532 (%v): %q", err, passwd)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt")); err != nil {
		t.Errorf("no CA certificates: %v", err)
	}
	var size int64
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		size += info.Size()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image contents: %.1f MB", float64(size)/1e6)
	if size > 40e6 {
		t.Errorf("the image holds %d bytes; a static Ferry and certificates are about 25 MB", size)
	}
}

// runInImage runs a command in the image's root file system as its user,
// and returns its combined output and exit code.
func runInImage(t *testing.T, b *buildah, ctr string, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := b.cmd(ctx, append([]string{"run", "--isolation", "chroot", ctr, "--"}, argv...)...)
	out, err := c.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatalf("buildah run %q: %v\n%s", argv, err, out)
	}
	return string(out), 0
}

// demoInImage runs `ferry demo` in the image and checks it serves /healthz
// and /readyz, and that its process runs as uid and gid 65532.
func demoInImage(t *testing.T, b *buildah, ctr, ferry string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := b.cmd(ctx, "run", "--isolation", "chroot", ctr, "--", ferry, "demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")
	c.Stderr = os.Stderr
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	var demoPid int
	defer func() {
		// SIGINT to Ferry itself stops it gracefully; buildah run exits then.
		if demoPid != 0 {
			_ = syscall.Kill(demoPid, syscall.SIGINT)
		}
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			if demoPid != 0 {
				_ = syscall.Kill(demoPid, syscall.SIGKILL)
			}
			_ = c.Process.Kill()
			<-done
		}
	}()
	adminRe := regexp.MustCompile(`Admin API:\s+http://(\S+)/status`)
	var admin string
	sc := bufio.NewScanner(stdout)
	for admin == "" && sc.Scan() {
		if m := adminRe.FindStringSubmatch(sc.Text()); m != nil {
			admin = m[1]
		}
	}
	if admin == "" {
		t.Fatalf("ferry demo in the image printed no admin address (%v)", sc.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	demoPid = descendant(t, c.Process.Pid, "ferry")
	uid, gid := procIDs(t, demoPid)
	if uid != "65532 65532 65532 65532" || gid != "65532 65532 65532 65532" {
		t.Errorf("ferry demo in the image runs as uid %q gid %q, want 65532 throughout", uid, gid)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		waitOK(t, "http://"+admin+path)
	}
}

// descendant finds the process named comm among pid's descendants.
func descendant(t *testing.T, pid int, comm string) int {
	t.Helper()
	found := 0
	testwait.Eventually(t, 10*time.Second, fmt.Sprintf("a %s process under buildah run (pid %d)", comm, pid), func() error {
		parents := map[int]int{}
		names := map[int]string{}
		dirs, _ := os.ReadDir("/proc")
		for _, d := range dirs {
			p, err := strconv.Atoi(d.Name())
			if err != nil {
				continue
			}
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
			if err != nil {
				continue
			}
			// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
			i, j := bytes.LastIndexByte(stat, ')'), bytes.IndexByte(stat, '(')
			if i < 0 || j < 0 || j > i {
				continue
			}
			fields := strings.Fields(string(stat[i+1:]))
			if len(fields) < 2 {
				continue
			}
			names[p] = string(stat[j+1 : i])
			parents[p], _ = strconv.Atoi(fields[1])
		}
		for p, name := range names {
			if name != comm {
				continue
			}
			for a := parents[p]; a > 1; a = parents[a] {
				if a == pid {
					found = p
					return nil
				}
			}
		}
		return fmt.Errorf("none among %d processes", len(names))
	})
	return found
}

// procIDs returns the Uid and Gid lines of /proc/pid/status: real,
// effective, saved and file-system IDs.
func procIDs(t *testing.T, pid int) (uid, gid string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			uid = strings.Join(strings.Fields(v), " ")
		}
		if v, ok := strings.CutPrefix(line, "Gid:"); ok {
			gid = strings.Join(strings.Fields(v), " ")
		}
	}
	return uid, gid
}

// waitOK polls url until it answers 200, for up to 30 seconds.
func waitOK(t *testing.T, url string) {
	t.Helper()
	testwait.Eventually(t, 30*time.Second, "GET "+url+" answering 200", func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})
}
