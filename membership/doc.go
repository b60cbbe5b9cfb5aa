// Package membership is the Ferry fleet: gossip membership on
// hashicorp/memberlist and rendezvous hashing over live members.
package membership
