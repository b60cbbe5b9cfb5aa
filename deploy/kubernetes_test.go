package deploy

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferry-gw/ferry/membership"
)

// kustomize renders the base; `go run` builds it from the module proxy
// (then from Go's caches), so Ferry's go.mod does not carry it.
const kustomize = "sigs.k8s.io/kustomize/kustomize/v5@v5.8.2"

// The Kubernetes versions the rendered objects are validated against: the
// oldest that labels StatefulSet pods with their ordinal
// (apps.kubernetes.io/pod-index, which node_id comes from), and the newest
// kubernetes-validate ships schemas for.
var kubeVersions = []string{"1.28.0", "1.37.0"}

// The parts of the objects the test checks; the schema validator checks
// every field.
type (
	object struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"`
		Spec struct {
			// StatefulSet
			ServiceName string `yaml:"serviceName"`
			Selector    struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Template struct {
				Metadata struct {
					Labels map[string]string `yaml:"labels"`
				} `yaml:"metadata"`
				Spec podSpec `yaml:"spec"`
			} `yaml:"template"`
			// Service (its selector is a plain map: ServiceSelector)
			ClusterIP                string        `yaml:"clusterIP"`
			PublishNotReadyAddresses bool          `yaml:"publishNotReadyAddresses"`
			Ports                    []servicePort `yaml:"ports"`
		} `yaml:"spec"`
		raw map[string]any
	}
	servicePort struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort string `yaml:"targetPort"`
		Protocol   string `yaml:"protocol"`
	}
	podSpec struct {
		SecurityContext struct {
			RunAsNonRoot bool `yaml:"runAsNonRoot"`
			RunAsUser    int  `yaml:"runAsUser"`
			RunAsGroup   int  `yaml:"runAsGroup"`
		} `yaml:"securityContext"`
		TerminationGracePeriodSeconds int         `yaml:"terminationGracePeriodSeconds"`
		Containers                    []container `yaml:"containers"`
		Volumes                       []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
			Secret *struct {
				SecretName string `yaml:"secretName"`
			} `yaml:"secret"`
		} `yaml:"volumes"`
	}
	container struct {
		Name  string   `yaml:"name"`
		Args  []string `yaml:"args"`
		Env   []envVar `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
			Protocol      string `yaml:"protocol"`
		} `yaml:"ports"`
		ReadinessProbe probe `yaml:"readinessProbe"`
		LivenessProbe  probe `yaml:"livenessProbe"`
		Security       struct {
			ReadOnlyRootFilesystem   bool `yaml:"readOnlyRootFilesystem"`
			AllowPrivilegeEscalation bool `yaml:"allowPrivilegeEscalation"`
		} `yaml:"securityContext"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
	}
	envVar struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	}
	probe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
	}
)

// render runs kustomize build on deploy/kubernetes and returns its output.
func render(t *testing.T) []byte {
	t.Helper()
	cmd := exec.Command("go", "run", kustomize, "build", "kubernetes")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go run %s build kubernetes: %v\n%s", kustomize, err, stderr.Bytes())
	}
	return out
}

// objects decodes the rendered documents, by kind and name.
func objects(t *testing.T, rendered []byte) map[string]*object {
	t.Helper()
	objs := map[string]*object{}
	dec := yaml.NewDecoder(bytes.NewReader(rendered))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		o := &object{}
		if err := n.Decode(o); err != nil {
			t.Fatal(err)
		}
		if err := n.Decode(&o.raw); err != nil {
			t.Fatal(err)
		}
		objs[o.Kind+"/"+o.Metadata.Name] = o
	}
	return objs
}

// byKind returns the only object of a kind whose name starts with prefix
// (generated names carry a hash suffix).
func byKind(t *testing.T, objs map[string]*object, kind, prefix string) *object {
	t.Helper()
	var found []*object
	for _, o := range objs {
		if o.Kind == kind && strings.HasPrefix(o.Metadata.Name, prefix) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s named %s*, have %d (objects: %v)", kind, prefix, len(found), slices.Sorted(maps.Keys(objs)))
	}
	return found[0]
}

// subset reports whether every label of sel is among labels.
func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestKubernetesSchemas: the rendered base is valid for the Kubernetes
// versions named, by the API's JSON schemas in strict mode (no field the
// API does not know).
func TestKubernetesSchemas(t *testing.T) {
	validate := filepath.Join(cacheDir(t), "deploy", "k8s-venv", "bin", "kubernetes-validate")
	if _, err := os.Stat(validate); err != nil {
		validate = tool(t, "kubernetes-validate", "pip install -r deploy/kubernetes/requirements.txt")
	}
	file := filepath.Join(t.TempDir(), "ferry.yaml")
	if err := os.WriteFile(file, render(t), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, v := range kubeVersions {
		out, err := exec.Command(validate, "--strict", "--quiet", "-k", v, file).CombinedOutput()
		if err != nil {
			t.Errorf("kubernetes-validate --strict -k %s: %v\n%s", v, err, out)
		}
	}
}

// TestKubernetesBase: the objects fit together (selectors, Service ports,
// probes, volumes, the image's user and command) and the ConfigMap's
// configuration, with the environment the StatefulSet gives a pod, is one
// Ferry accepts, with the node ID, advertised host and gossip address of
// that pod.
func TestKubernetesBase(t *testing.T) {
	objs := objects(t, render(t))
	sts := byKind(t, objs, "StatefulSet", "ferry")
	headless := byKind(t, objs, "Service", "ferry-headless")
	client := objs["Service/ferry"]
	pdb := byKind(t, objs, "PodDisruptionBudget", "ferry")
	cm := byKind(t, objs, "ConfigMap", "ferry-config")
	secret := byKind(t, objs, "Secret", "ferry-secrets")
	if client == nil {
		t.Fatal("no Service ferry")
	}

	pod := sts.Spec.Template.Spec
	labels := sts.Spec.Template.Metadata.Labels
	if !subset(sts.Spec.Selector.MatchLabels, labels) || !subset(pdb.Spec.Selector.MatchLabels, labels) {
		t.Errorf("the StatefulSet's or the PodDisruptionBudget's selector does not select the pods %v", labels)
	}
	if sts.Spec.ServiceName != headless.Metadata.Name {
		t.Errorf("serviceName %q, want the headless Service %q", sts.Spec.ServiceName, headless.Metadata.Name)
	}
	if headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("%s: clusterIP %q, publishNotReadyAddresses %v; want None and true (members join before they are ready)",
			headless.Metadata.Name, headless.Spec.ClusterIP, headless.Spec.PublishNotReadyAddresses)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, have %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, svc := range []*object{headless, client} {
		sel := map[string]string{}
		if m, ok := svc.raw["spec"].(map[string]any)["selector"].(map[string]any); ok {
			for k, v := range m {
				sel[k], _ = v.(string)
			}
		}
		if !subset(sel, labels) {
			t.Errorf("Service %s's selector %v does not select the pods %v", svc.Metadata.Name, sel, labels)
		}
		for _, p := range svc.Spec.Ports {
			if _, ok := ports[p.TargetPort]; !ok {
				t.Errorf("Service %s port %s targets %q, which the container does not name", svc.Metadata.Name, p.Name, p.TargetPort)
			}
		}
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.ReadinessProbe.HTTPGet.Port != "admin" || c.LivenessProbe.HTTPGet.Port != "admin" {
		t.Errorf("probes: readiness %+v, liveness %+v; want /readyz and /healthz on the admin port", c.ReadinessProbe.HTTPGet, c.LivenessProbe.HTTPGet)
	}
	sc := pod.SecurityContext
	if !sc.RunAsNonRoot || strconv.Itoa(sc.RunAsUser)+":"+strconv.Itoa(sc.RunAsGroup) != imageUser ||
		!c.Security.ReadOnlyRootFilesystem || c.Security.AllowPrivilegeEscalation {
		t.Errorf("security context: pod %+v, container %+v; want non-root as the image's %s, a read-only root, no privilege escalation", sc, c.Security, imageUser)
	}
	if want := []string{"serve", "--config", "/etc/ferry/ferry.yaml"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want the image's command %q", c.Args, want)
	}

	// Where the volumes are mounted, and what each holds.
	mounts := map[string]map[string]string{} // mount path → file → content
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			switch {
			case v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name:
				mounts[m.MountPath] = cm.Data
			case v.Secret != nil && v.Secret.SecretName == secret.Metadata.Name:
				files := map[string]string{}
				for k, b64 := range secret.Data {
					b, err := base64.StdEncoding.DecodeString(b64)
					if err != nil {
						t.Fatalf("Secret %s key %s: %v", secret.Metadata.Name, k, err)
					}
					files[k] = string(b)
				}
				mounts[m.MountPath] = files
			default:
				t.Errorf("volume %s names no generated ConfigMap or Secret", v.Name)
			}
		}
	}
	if _, ok := mounts["/etc/ferry"]["ferry.yaml"]; !ok {
		t.Fatalf("no ferry.yaml mounted at /etc/ferry (mounts %v)", slices.Sorted(maps.Keys(mounts)))
	}
	// The placeholder key must not run: Ferry refuses it.
	if _, err := membership.LoadKey(writeFile(t, mounts["/etc/ferry-secrets"]["gossip.key"])); err == nil {
		t.Error("Ferry accepts the placeholder gossip key: it must be refused so that it is replaced")
	}

	cfg := ferryConfig(t, mounts, podEnv(t, c.Env, "ferry-1", "prod", "10.1.2.3", "1"))
	want := map[string]any{
		"node_id":         1,
		"advertised_host": "ferry-1." + headless.Metadata.Name + ".prod.svc.cluster.local",
		"fleet.advertise": "10.1.2.3:" + strconv.Itoa(ports["gossip"]),
		"fleet.bind":      "0.0.0.0:" + strconv.Itoa(ports["gossip"]),
		"admin_listen":    "0.0.0.0:" + strconv.Itoa(ports["admin"]),
		"listen":          "0.0.0.0:" + strconv.Itoa(ports["kafka"]),
	}
	for path, v := range want {
		if got := lookup(cfg, path); got != v {
			t.Errorf("ferry --print-config %s = %v, want %v", path, got, v)
		}
	}
	// Every seed names the headless Service at the gossip port.
	seeds, _ := lookup(cfg, "fleet.seeds").([]any)
	for _, s := range seeds {
		host, port, _ := net.SplitHostPort(s.(string))
		if !strings.HasPrefix(host, headless.Metadata.Name) || port != strconv.Itoa(ports["gossip"]) {
			t.Errorf("fleet seed %v: want the headless Service %s at the gossip port", s, headless.Metadata.Name)
		}
	}
	if len(seeds) == 0 {
		t.Error("no fleet seeds")
	}
	// Each lane's port is a container port.
	lanes, _ := lookup(cfg, "lanes").(int)
	for i := range lanes {
		if !slices.Contains(slices.Collect(maps.Values(ports)), ports["kafka"]+i) {
			t.Errorf("lane %d's port %d is not a container port", i, ports["kafka"]+i)
		}
	}
	// The kubelet kills a pod the grace period after SIGTERM: Ferry's drain
	// (the lame-duck period, then the answers it still owes) must end first.
	lameDuck, _ := time.ParseDuration(fmt.Sprint(lookup(cfg, "lame_duck_duration")))
	shutdown, _ := time.ParseDuration(fmt.Sprint(lookup(cfg, "shutdown_timeout")))
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; lameDuck+shutdown == 0 || lameDuck+shutdown >= grace {
		t.Errorf("terminationGracePeriodSeconds %s, lame_duck_duration %s + shutdown_timeout %s: the drain must end within the grace period", grace, lameDuck, shutdown)
	}
	for _, key := range []string{"admin_token_file", "fleet.key_file"} {
		p, _ := lookup(cfg, key).(string)
		dir, file := filepath.Split(p)
		if _, ok := mounts[filepath.Clean(dir)][file]; !ok {
			t.Errorf("%s %q is no file of a mounted volume", key, p)
		}
	}
}

// podEnv resolves a container's environment as the kubelet would for a pod
// of the StatefulSet: field references from the pod given, $(VAR) from the
// variables defined before.
func podEnv(t *testing.T, env []envVar, name, namespace, ip, index string) []string {
	t.Helper()
	fields := map[string]string{
		"metadata.name":      name,
		"metadata.namespace": namespace,
		"status.podIP":       ip,
		"metadata.labels['apps.kubernetes.io/pod-index']": index,
	}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	vars := map[string]string{}
	var out []string
	for _, e := range env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				t.Fatalf("env %s: only field references are resolved here", e.Name)
			}
			f, ok := fields[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("env %s: field %s not known to the test", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			v = f
		}
		v = ref.ReplaceAllStringFunc(v, func(m string) string {
			if s, ok := vars[m[2:len(m)-1]]; ok {
				return s
			}
			return m
		})
		vars[e.Name] = v
		out = append(out, e.Name+"="+v)
	}
	return out
}

// ferryConfig writes the mounted volumes under a temporary root, points the
// configuration's paths there, and returns what `ferry serve --print-config`
// makes of it with env.
func ferryConfig(t *testing.T, mounts map[string]map[string]string, env []string) map[string]any {
	t.Helper()
	root := t.TempDir()
	var rewrite []string
	for dir, files := range mounts {
		for name, content := range files {
			p := filepath.Join(root, dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		rewrite = append(rewrite, dir+"/", filepath.Join(root, dir)+"/")
	}
	config := filepath.Join(root, "etc/ferry/ferry.yaml")
	text := strings.NewReplacer(rewrite...).Replace(mounts["/etc/ferry"]["ferry.yaml"])
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "ferry")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/ferry").CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/ferry: %v\n%s", err, out)
	}

	// Without FERRY_NODE_ID (no pod-index label) Ferry refuses to start.
	var noIndex []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "FERRY_NODE_ID=") {
			noIndex = append(noIndex, kv)
		}
	}
	cmd := exec.Command(bin, "serve", "--config", config, "--print-config")
	cmd.Env = noIndex
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "node_id -1") {
		t.Errorf("without FERRY_NODE_ID: %v, %s; want node_id -1 refused", err, out)
	}

	cmd = exec.Command(bin, "serve", "--config", config, "--print-config")
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ferry serve --print-config with the ConfigMap's ferry.yaml and env %q: %v\n%s", env, err, stderr.Bytes())
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("--print-config output: %v\n%s", err, out)
	}
	// The paths as the pod sees them again.
	for _, key := range []string{"admin_token_file", "fleet.key_file"} {
		if s, ok := lookup(cfg, key).(string); ok {
			set(cfg, key, strings.TrimPrefix(s, root))
		}
	}
	return cfg
}

// lookup returns the value at a dotted path of a decoded YAML map.
func lookup(m map[string]any, path string) any {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func set(m map[string]any, path string, v any) {
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		m, _ = m[k].(map[string]any)
	}
	if m != nil {
		m[keys[len(keys)-1]] = v
	}
}

// writeFile writes content to a temporary file and returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKubernetesGossipKey: a key made as the base's secrets/gossip.key says
// (head -c 32 /dev/urandom | base64) is one Ferry loads.
func TestKubernetesGossipKey(t *testing.T) {
	placeholder, err := os.ReadFile("kubernetes/secrets/gossip.key")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(placeholder), "head -c 32 /dev/urandom | base64") {
		t.Fatalf("kubernetes/secrets/gossip.key no longer says how to make a key: %q", placeholder)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if _, err := membership.LoadKey(writeFile(t, base64.StdEncoding.EncodeToString(key)+"\n")); err != nil {
		t.Fatal(err)
	}
}
