package clientauth

// The credential store: the users SASL/SCRAM and SASL/PLAIN authenticate,
// in a YAML file that `ferry users add` writes. Per user and mechanism it
// holds what a Kafka broker keeps for SCRAM (salt, iterations, StoredKey,
// ServerKey, base64), never a password: SCRAM checks the client's proof
// against StoredKey, PLAIN derives StoredKey from the password it was sent
// and compares. The file is read again when its modification time or size
// changes, checked at most once a second, so adding a user needs no
// restart; a file that no longer parses is logged and the last good one
// stays in force.
//
//	# written by ferry users; holds no passwords
//	users:
//	  alice:
//	    SCRAM-SHA-512: {salt: ..., iterations: 8192, stored_key: ..., server_key: ...}
//	    SCRAM-SHA-256: {salt: ..., iterations: 8192, stored_key: ..., server_key: ...}

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"gopkg.in/yaml.v3"
)

// CredentialEntry is one mechanism's credential in the file.
type CredentialEntry struct {
	Salt       string `yaml:"salt"`
	Iterations int    `yaml:"iterations"`
	StoredKey  string `yaml:"stored_key"`
	ServerKey  string `yaml:"server_key"`
}

// Credentials is the credential store: users by name, each with a
// credential per SCRAM mechanism.
type Credentials struct {
	Users map[string]map[string]CredentialEntry `yaml:"users"`
}

// ParseCredentials reads a store and checks every entry.
func ParseCredentials(b []byte) (*Credentials, error) {
	var c Credentials
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) { // io.EOF: an empty file, no users
		return nil, err
	}
	if c.Users == nil {
		c.Users = map[string]map[string]CredentialEntry{}
	}
	for user, mechs := range c.Users {
		if user == "" {
			return nil, errors.New("a user has an empty name")
		}
		for mech, e := range mechs {
			if _, err := e.decode(mech); err != nil {
				return nil, fmt.Errorf("user %q, %s: %w", user, mech, err)
			}
		}
	}
	return &c, nil
}

// LoadCredentials reads the store at path; a file that does not exist is an
// empty store.
func LoadCredentials(path string) (*Credentials, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Credentials{Users: map[string]map[string]CredentialEntry{}}, nil
	}
	if err != nil {
		return nil, err
	}
	c, err := ParseCredentials(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Save writes the store to path atomically (a temporary file renamed over
// it), readable by its owner only.
func (c *Credentials) Save(path string) error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	b = append([]byte("# Ferry's SASL credential store, written by `ferry users`: salted SCRAM keys, no passwords.\n"), b...)
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Set adds or replaces a user's credential for one mechanism.
func (c *Credentials) Set(user, mechanism string, cred SCRAMCredential) {
	if c.Users == nil {
		c.Users = map[string]map[string]CredentialEntry{}
	}
	if c.Users[user] == nil {
		c.Users[user] = map[string]CredentialEntry{}
	}
	c.Users[user][mechanism] = CredentialEntry{
		Salt:       base64.StdEncoding.EncodeToString(cred.Salt),
		Iterations: cred.Iterations,
		StoredKey:  base64.StdEncoding.EncodeToString(cred.StoredKey),
		ServerKey:  base64.StdEncoding.EncodeToString(cred.ServerKey),
	}
}

// Names lists the users, sorted.
func (c *Credentials) Names() []string {
	out := make([]string, 0, len(c.Users))
	for u := range c.Users {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

func (e CredentialEntry) decode(mechanism string) (SCRAMCredential, error) {
	h := scramHash(mechanism)
	if h == nil {
		return SCRAMCredential{}, fmt.Errorf("unknown mechanism (want %s or %s)", MechanismSCRAMSHA256, MechanismSCRAMSHA512)
	}
	var cred SCRAMCredential
	var err error
	if cred.Salt, err = base64.StdEncoding.DecodeString(e.Salt); err != nil || len(cred.Salt) == 0 {
		return cred, errors.New("salt: want base64")
	}
	if cred.StoredKey, err = base64.StdEncoding.DecodeString(e.StoredKey); err != nil || len(cred.StoredKey) != h().Size() {
		return cred, fmt.Errorf("stored_key: want %d bytes, base64", h().Size())
	}
	if cred.ServerKey, err = base64.StdEncoding.DecodeString(e.ServerKey); err != nil || len(cred.ServerKey) != h().Size() {
		return cred, fmt.Errorf("server_key: want %d bytes, base64", h().Size())
	}
	if e.Iterations < MinSCRAMIterations {
		return cred, fmt.Errorf("iterations %d: at least %d", e.Iterations, MinSCRAMIterations)
	}
	cred.Iterations = e.Iterations
	return cred, nil
}

// credentialStore serves lookups from the file, reloading it on change.
type credentialStore struct {
	path  string
	onErr func(error)
	mu    sync.Mutex
	users map[string]map[string]SCRAMCredential
	// iterations are the users' iteration counts per mechanism, one per
	// user, sorted: what an unknown user's count is drawn from.
	iterations map[string][]int
	mtime      time.Time
	size       int64
	probed     time.Time
	now        func() time.Time
}

// credentialProbeInterval is how often the file is checked for changes.
const credentialProbeInterval = time.Second

func newCredentialStore(path string, onErr func(error)) (*credentialStore, error) {
	st := &credentialStore{path: path, onErr: onErr, now: time.Now}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("credentials_file: %w", err)
	}
	if err := st.load(fi); err != nil {
		return nil, fmt.Errorf("credentials_file: %w", err)
	}
	return st, nil
}

func (st *credentialStore) load(fi os.FileInfo) error {
	c, err := LoadCredentials(st.path)
	if err != nil {
		return err
	}
	users := make(map[string]map[string]SCRAMCredential, len(c.Users))
	iterations := map[string][]int{}
	for u, mechs := range c.Users {
		users[u] = make(map[string]SCRAMCredential, len(mechs))
		for m, e := range mechs {
			cred, _ := e.decode(m) // checked by ParseCredentials
			users[u][m] = cred
			iterations[m] = append(iterations[m], cred.Iterations)
		}
	}
	for _, its := range iterations {
		slices.Sort(its)
	}
	st.users, st.iterations, st.mtime, st.size = users, iterations, fi.ModTime(), fi.Size()
	return nil
}

// lookup returns a user's credential for mechanism, reloading the file
// first when it changed.
func (st *credentialStore) lookup(user, mechanism string) (SCRAMCredential, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if now := st.now(); now.Sub(st.probed) >= credentialProbeInterval {
		st.probed = now
		if fi, err := os.Stat(st.path); err != nil {
			st.onErr(fmt.Errorf("credentials_file: %w; keeping the users last read", err))
		} else if !fi.ModTime().Equal(st.mtime) || fi.Size() != st.size {
			if err := st.load(fi); err != nil {
				st.onErr(fmt.Errorf("credentials_file changed but cannot be used, keeping the users last read: %w", err))
				st.mtime, st.size = fi.ModTime(), fi.Size() // not again until it changes
			}
		}
	}
	cred, ok := st.users[user][mechanism]
	return cred, ok
}

// fakeIterations is the iteration count an unknown user is answered for
// mechanism: the count of the store's user that pick (drawn from the
// name) falls on, so each count comes up as often as users have it, and
// neither the count nor how often it is seen tells an unknown name from a
// real one. DefaultSCRAMIterations while no user has the mechanism.
func (st *credentialStore) fakeIterations(mechanism string, pick uint64) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	its := st.iterations[mechanism]
	if len(its) == 0 {
		return DefaultSCRAMIterations
	}
	return its[pick%uint64(len(its))]
}

// count is how many users the store holds.
func (st *credentialStore) count() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.users)
}
