// Package membership is the fleet of Ferry processes: who is a member,
// what each serves, and a way to call them all. It knows nothing of Kafka.
//
// Members gossip over hashicorp/memberlist (UDP and TCP on one port, SWIM
// failure detection, encrypted and authenticated with a shared key when one
// is given). A member's node name is its node ID; its Meta (advertised
// client host and ports, admin address, version, the routing generation it
// serves) is its memberlist node metadata, so every member learns every
// other's within a few gossip rounds. Members, Alive and Changed are the
// view; SetGeneration gossips a new generation.
//
// New binds the gossip port; Run joins the seeds (host:port entries, or a
// DNS name resolving to several), retrying with backoff while none lets
// the member in (Ready says why, for /readyz), and later joins again any
// seed that is not a live member, which heals a partition that outlasted
// memberlist's gossip to the dead. A DNS seed should list members that are
// not ready yet too (a headless service with publishNotReadyAddresses):
// the first member is ready once the seeds name no one but itself.
//
// Two members may not share a node ID: a joiner whose ID an alive member
// at another address holds is refused by both sides (the merge delegate
// during the join's push/pull, the alive delegate for later gossip) and
// keeps retrying; once the old entry is dead — a member restarted at a new
// address — it gets in. A restart at the same address is simply the member
// coming back.
//
// Call and CallAll are the fleet's acknowledged exchange (the switchover's
// barrier): a request with an ID goes to the member over memberlist's
// reliable messages, its handler (Handle) runs on a goroutine of its own,
// and the answer comes back the same way; a member that does not answer
// ends the call when its context does.
//
// memberlist's API reports neither suspect members (Members lists them as
// alive) nor a dead member from one that left, so the fleet keeps its own
// table from memberlist's events and two messages of its own: a heartbeat
// each quarter probe interval, whose silence makes a member suspect, and a
// member's word that it leaves on purpose (liveness.go). Nothing reads
// memberlist's internals.
package membership
