// Package clusterauth is Ferry's security towards one physical Kafka
// cluster: TLS (a CA bundle, a client certificate, the server name, the
// minimum version) and SASL (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER, with
// franz-go's mechanisms). One Security serves every connection Ferry opens
// to the cluster: franz-go clients are built by its NewClient (the only
// way, so that none goes without the security), raw connections (the
// proxy's pools, the mirror's partition writers) by its Dial, which does
// TLS and then the SASL exchange itself.
//
// Secrets are never in the configuration: a password, token or client
// secret is named by a file or an environment variable, and read each time
// a connection authenticates, so that a changed file is used from the next
// connection on. Certificate and key files are read again when their
// modification time changes.
package clusterauth

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// TLS is a cluster's TLS settings (clusters[].tls in Ferry's YAML).
type TLS struct {
	// Enabled turns TLS on; the other keys imply it.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle of the CAs the brokers' certificates are
	// checked against. Default: the system's.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are Ferry's client certificate and key (PEM),
	// for brokers that require one (mutual TLS). Both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the brokers' certificates must hold.
	// Default: the host of the address dialled.
	ServerName string `yaml:"server_name"`
	// MinVersion is the lowest TLS version accepted: "1.2" (default) or
	// "1.3".
	MinVersion string `yaml:"min_version"`
	// InsecureSkipVerify accepts any certificate. For tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// SASL is a cluster's SASL settings (clusters[].sasl in Ferry's YAML).
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER.
	Mechanism string `yaml:"mechanism"`
	// Username is the user of PLAIN and SCRAM.
	Username string `yaml:"username"`
	// PasswordFile names a file holding the password (PLAIN, SCRAM);
	// whitespace around it is ignored.
	PasswordFile string `yaml:"password_file"`
	// PasswordEnv names an environment variable holding the password.
	PasswordEnv string `yaml:"password_env"`
	// TokenFile names a file holding an OAUTHBEARER token, read at each
	// authentication (something else keeps it fresh).
	TokenFile string `yaml:"token_file"`
	// TokenEnv names an environment variable holding the token.
	TokenEnv string `yaml:"token_env"`
	// TokenEndpoint is an OAuth 2 token endpoint (https) Ferry asks for a
	// token with the client-credentials grant, as ClientID with the
	// secret from ClientSecretFile or ClientSecretEnv, for Scope.
	TokenEndpoint    string `yaml:"token_endpoint"`
	ClientID         string `yaml:"client_id"`
	ClientSecretFile string `yaml:"client_secret_file"`
	ClientSecretEnv  string `yaml:"client_secret_env"`
	Scope            string `yaml:"scope"`
	// TokenEndpointInsecure allows an http:// token endpoint. For tests.
	TokenEndpointInsecure bool `yaml:"token_endpoint_insecure"`
}

// Mechanisms are the SASL mechanisms Ferry speaks towards clusters.
var Mechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"}

// SecretKeys are keys a user may write a secret in by mistake; the
// configuration has none of them (SecretHint says what to use instead).
var SecretKeys = map[string]string{
	"password":      "password_file or password_env",
	"token":         "token_file or token_env",
	"client_secret": "client_secret_file or client_secret_env",
}

// Validate checks the settings without reading a file; key is the YAML
// path of the cluster's entry (clusters[0] (a)), for the messages. New
// also checks that the files named can be read.
func Validate(key string, t *TLS, s *SASL) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(key+": "+format, args...)) }
	if t != nil {
		if _, err := tlsVersion(t.MinVersion); err != nil {
			bad("tls.min_version %q: %v", t.MinVersion, err)
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			bad("tls: cert_file and key_file go together (the client certificate and its key)")
		}
	}
	if s == nil {
		return errs
	}
	mech := strings.ToUpper(s.Mechanism)
	switch mech {
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if s.Username == "" {
			bad("sasl.username is required for %s", mech)
		}
		switch {
		case s.PasswordFile == "" && s.PasswordEnv == "":
			bad("sasl: %s needs the password: sasl.password_file or sasl.password_env", mech)
		case s.PasswordFile != "" && s.PasswordEnv != "":
			bad("sasl: password_file and password_env both set; use one")
		}
		for k, v := range map[string]string{"token_file": s.TokenFile, "token_env": s.TokenEnv, "token_endpoint": s.TokenEndpoint, "client_id": s.ClientID, "client_secret_file": s.ClientSecretFile, "client_secret_env": s.ClientSecretEnv, "scope": s.Scope} {
			if v != "" {
				bad("sasl.%s is for OAUTHBEARER, not %s", k, mech)
			}
		}
	case "OAUTHBEARER":
		if s.PasswordFile != "" || s.PasswordEnv != "" {
			bad("sasl: OAUTHBEARER takes no password: a token (token_file, token_env) or a token endpoint (token_endpoint, client_id, client_secret_file or client_secret_env)")
		}
		n := 0
		for _, v := range []string{s.TokenFile, s.TokenEnv, s.TokenEndpoint} {
			if v != "" {
				n++
			}
		}
		if n != 1 {
			bad("sasl: OAUTHBEARER needs exactly one of token_file, token_env and token_endpoint")
		}
		if s.TokenEndpoint != "" {
			u, err := url.Parse(s.TokenEndpoint)
			switch {
			case err != nil || u.Host == "":
				bad("sasl.token_endpoint %q: not a URL", s.TokenEndpoint)
			case u.Scheme != "https" && !(u.Scheme == "http" && s.TokenEndpointInsecure):
				bad("sasl.token_endpoint %q: must be https (the client secret is sent to it)", s.TokenEndpoint)
			}
			if s.ClientID == "" {
				bad("sasl.client_id is required with token_endpoint")
			}
			if (s.ClientSecretFile == "") == (s.ClientSecretEnv == "") {
				bad("sasl: token_endpoint needs the client secret: one of client_secret_file and client_secret_env")
			}
		} else if s.ClientID != "" || s.ClientSecretFile != "" || s.ClientSecretEnv != "" || s.Scope != "" {
			bad("sasl: client_id, client_secret_file, client_secret_env and scope go with token_endpoint")
		}
	case "":
		bad("sasl.mechanism is required: one of %s", strings.Join(Mechanisms, ", "))
	default:
		bad("sasl.mechanism %q: not one Ferry speaks; use one of %s", s.Mechanism, strings.Join(Mechanisms, ", "))
	}
	return errs
}

func tlsVersion(v string) (uint16, error) {
	switch v {
	case "", "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	case "1.0", "1.1":
		return 0, errors.New("TLS 1.0 and 1.1 are not accepted; use 1.2 or 1.3")
	}
	return 0, errors.New(`must be "1.2" or "1.3"`)
}

// secret is a value read at use time from a file or the environment.
type secret struct {
	what string // "password", "token", "client secret", for errors
	file string
	env  string
}

func (s secret) read() (string, error) {
	if s.file != "" {
		b, err := os.ReadFile(s.file)
		if err != nil {
			return "", fmt.Errorf("reading the %s: %w", s.what, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return "", fmt.Errorf("the %s file %s is empty", s.what, s.file)
		}
		return v, nil
	}
	v := strings.TrimSpace(os.Getenv(s.env))
	if v == "" {
		return "", fmt.Errorf("the %s environment variable %s is not set", s.what, s.env)
	}
	return v, nil
}
