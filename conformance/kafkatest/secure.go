package kafkatest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferry-gw/ferry/conformance/testpki"
)

// Secure describes a TLS listener for WithSecureListener: SSL, or SASL_SSL
// when Mechanisms are given. Its certificate is issued by CA for 127.0.0.1
// and localhost; the key store and trust store are PEM, inline in the
// properties, so no file is written.
type Secure struct {
	// Name is the listener's name; default "SECURE".
	Name string
	// CA signs the brokers' certificate.
	CA *testpki.CA
	// ClientCA, when set, makes the listener require a client
	// certificate signed by it (mutual TLS).
	ClientCA *testpki.CA
	// Mechanisms are the SASL mechanisms enabled: SCRAM-SHA-256,
	// SCRAM-SHA-512 (users made with AddSCRAMUser), PLAIN (users in
	// PlainUsers), OAUTHBEARER (Kafka's unsecured JWS validator).
	Mechanisms []string
	// PlainUsers are the PLAIN users and their passwords.
	PlainUsers map[string]string
	// ReauthAfter sets connections.max.reauth.ms (0: sessions never
	// expire): the SASL listener is the only one it applies to.
	ReauthAfter time.Duration
}

// WithSecureListener adds a TLS listener (see Secure) to every node. The
// default PLAINTEXT listener stays, for tests to read and administer
// directly (Addrs); the secure one is at ListenerAddrs(name).
func WithSecureListener(s Secure) Option {
	return func(c *Config) {
		name := s.Name
		if name == "" {
			name = "SECURE"
		}
		leaf, err := s.CA.Issue(testpki.LeafOptions{CommonName: "kafka-" + strings.ToLower(name), Hosts: []string{"127.0.0.1", "localhost"}})
		if err != nil {
			panic(fmt.Sprintf("kafkatest: issuing the broker certificate: %v", err))
		}
		l := Listener{Name: name, Protocol: "SSL", Config: map[string]string{
			"ssl.keystore.type":              "PEM",
			"ssl.keystore.certificate.chain": inlinePEM(leaf.CertPEM),
			"ssl.keystore.key":               inlinePEM(leaf.KeyPEM),
		}}
		if s.ClientCA != nil {
			l.Config["ssl.truststore.type"] = "PEM"
			l.Config["ssl.truststore.certificates"] = inlinePEM(s.ClientCA.PEM)
			l.Config["ssl.client.auth"] = "required"
		}
		if len(s.Mechanisms) > 0 {
			l.Protocol = "SASL_SSL"
			l.Config["sasl.enabled.mechanisms"] = strings.Join(s.Mechanisms, ",")
			for _, m := range s.Mechanisms {
				key := strings.ToLower(m) + ".sasl.jaas.config"
				switch m {
				case "SCRAM-SHA-256", "SCRAM-SHA-512":
					l.Config[key] = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
				case "PLAIN":
					var users []string
					for u, p := range s.PlainUsers {
						users = append(users, fmt.Sprintf("user_%s=%q", u, p))
					}
					slices.Sort(users)
					l.Config[key] = "org.apache.kafka.common.security.plain.PlainLoginModule required " + strings.Join(users, " ") + ";"
				case "OAUTHBEARER":
					l.Config[key] = `org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="broker";`
				}
			}
		}
		if s.ReauthAfter > 0 {
			if c.BrokerConfig == nil {
				c.BrokerConfig = map[string]string{}
			}
			c.BrokerConfig["connections.max.reauth.ms"] = fmt.Sprint(s.ReauthAfter.Milliseconds())
		}
		c.Listeners = append(c.Listeners, l)
	}
}

// inlinePEM is PEM as a properties value: one line, newlines escaped.
func inlinePEM(b []byte) string {
	return strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", `\n`)
}

// ListenerAddrs returns every node's address on the named extra listener.
func (c *Cluster) ListenerAddrs(name string) []string {
	var out []string
	for _, id := range c.NodeIDs() {
		out = append(out, c.ListenerAddr(name, id))
	}
	return out
}

// AddSCRAMUser creates (or updates) a SCRAM user through the admin API,
// on the PLAINTEXT listener, and waits until every node has it.
func (c *Cluster) AddSCRAMUser(ctx context.Context, mechanism, user, password string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	m := kadm.ScramSha512
	if mechanism == "SCRAM-SHA-256" {
		m = kadm.ScramSha256
	}
	res, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: user, Mechanism: m, Iterations: 4096, Password: password}})
	if err != nil {
		return err
	}
	if err := res.Error(); err != nil {
		return err
	}
	// The credential reaches each broker with the metadata log: wait
	// until each describes it.
	for _, id := range c.NodeIDs() {
		ncl, err := kgo.NewClient(kgo.SeedBrokers(c.Addr(id)))
		if err != nil {
			return err
		}
		for {
			d, err := kadm.NewClient(ncl).DescribeUserSCRAMs(ctx, user)
			if err == nil && d.Error() == nil && len(d[user].CredInfos) > 0 {
				break
			}
			if ctx.Err() != nil {
				ncl.Close()
				return fmt.Errorf("SCRAM user %s not on node %d: %v", user, id, ctx.Err())
			}
			time.Sleep(100 * time.Millisecond)
		}
		ncl.Close()
	}
	return nil
}
