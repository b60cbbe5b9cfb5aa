// Package clientauth checks who a client of Ferry's Kafka listeners is:
// TLS with client certificates (the listener's configuration, reloaded
// when its files change), and SASL's PLAIN, SCRAM-SHA-256/512 and
// OAUTHBEARER against the credential store or a JWKS, with the token
// buckets that limit login attempts. It knows nothing of Kafka requests
// or connections: package proxy runs the exchange on a client's
// connection and asks this one whether the credentials hold.
//
// A failed check is a *Failure: Reason is the label of
// ferry_client_auth_failures_total, Msg what the client is told. A wrong
// password and an unknown user are told the same, and SCRAM answers an
// unknown user as it would a real one (a salt and an iteration count
// derived from the name), so the exchange never tells which users exist.
package clientauth
