// Package cluster makes several cache servers one cache: membership and
// the map of which server owns which keys live in etcd, and a client
// routes each key to the servers that own it.
//
// Each server registers itself (Join) under a lease that it keeps alive;
// a server that leaves revokes its lease, and one that dies is dropped
// when its lease expires (the TTL, a few seconds). The map is the member
// list plus the cluster's replication factor R, kept in etcd beside it;
// everyone who reads the same members computes the same owners for a key
// by rendezvous (highest random weight) hashing, so the map needs no
// coordinator and a change of members moves only the keys of the servers
// that came or went.
//
// Every key is kept on R servers: a client writes to all of its owners and
// reads from the first one that answers. When a server leaves, each of its
// keys still has R-1 copies on the others; a read that finds a key only on
// a lower-ranked owner writes it back to the owners that missed it
// (read repair), and Client.Repair copies every key to the owners that
// lack it. Replication, not a refill from the departed server's files,
// because those files are on the machine that is gone.
//
// A single server needs none of this: dial it with the cache package.
package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Errors, matchable with errors.Is.
var (
	// ErrBadMember: a member record in etcd that does not parse, or a
	// Member that is not valid to register.
	ErrBadMember = errors.New("cluster: bad member record")
	// ErrMemberExists: another server is registered under the same ID.
	ErrMemberExists = errors.New("cluster: member ID in use by another server")
	// ErrNoMembers: the cluster has no member to serve a key.
	ErrNoMembers = errors.New("cluster: no members")
	// ErrBadConfig: the cluster's config record in etcd does not parse.
	ErrBadConfig = errors.New("cluster: bad cluster config")
)

// Member is one server of a cluster, as it registers itself in etcd.
type Member struct {
	// ID names the server in the cluster, unique and stable across its
	// restarts (it places keys: a new ID moves them).
	ID string `json:"id"`
	// Addr is the cache server's host:port, where clients dial it.
	Addr string `json:"addr"`
	// HTTP is its monitor's host:port (status page and metrics), if any.
	HTTP string `json:"http,omitempty"`
	// Started is when the server registered.
	Started time.Time `json:"started"`
}

// recordVersion is the version of the member record's format.
const recordVersion = 1

// Limits of a member record.
const (
	MaxIDLen     = 128
	maxRecordLen = 4096
)

type memberRecord struct {
	V int `json:"v"`
	Member
}

// AppendRecord appends m's etcd record to b.
func (m Member) AppendRecord(b []byte) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return b, err
	}
	j, err := json.Marshal(memberRecord{V: recordVersion, Member: m})
	if err != nil {
		return b, fmt.Errorf("%w: %w", ErrBadMember, err)
	}
	return append(b, j...), nil
}

// ParseMember decodes a member record: the value of etcd's key
// <prefix>/members/<id>, whose last segment must match the record's ID.
// Anything else is ErrBadMember.
func ParseMember(id string, b []byte) (Member, error) {
	if len(b) > maxRecordLen {
		return Member{}, fmt.Errorf("%w: %s: %d bytes", ErrBadMember, quoteID(id), len(b))
	}
	var r memberRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return Member{}, fmt.Errorf("%w: %s: %w", ErrBadMember, quoteID(id), err)
	}
	if r.V != recordVersion {
		return Member{}, fmt.Errorf("%w: %s: version %d", ErrBadMember, quoteID(id), r.V)
	}
	if r.ID != id {
		return Member{}, fmt.Errorf("%w: %s: record names %s", ErrBadMember, quoteID(id), quoteID(r.ID))
	}
	if err := r.Member.Validate(); err != nil {
		return Member{}, err
	}
	return r.Member, nil
}

// Validate checks that m can be registered: an ID of printable ASCII
// without '/' and addresses of host:port.
func (m Member) Validate() error {
	if err := checkID(m.ID); err != nil {
		return err
	}
	if err := checkHostPort(m.Addr); err != nil {
		return fmt.Errorf("%w: %s: addr: %w", ErrBadMember, quoteID(m.ID), err)
	}
	if m.HTTP != "" {
		if err := checkHostPort(m.HTTP); err != nil {
			return fmt.Errorf("%w: %s: http: %w", ErrBadMember, quoteID(m.ID), err)
		}
	}
	return nil
}

func checkID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return fmt.Errorf("%w: ID of %d bytes (1 to %d)", ErrBadMember, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f || c == '/' {
			return fmt.Errorf("%w: ID %s has a space, a '/' or a byte outside printable ASCII", ErrBadMember, quoteID(id))
		}
	}
	return nil
}

func checkHostPort(a string) error {
	if len(a) > 300 {
		return fmt.Errorf("address of %d bytes", len(a))
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if host == "" || port == "" || strings.ContainsAny(a, " \t\r\n/") {
		return fmt.Errorf("address %q is not host:port", a)
	}
	return nil
}

// quoteID quotes an ID from outside for a message, cut to a length that
// keeps the message readable.
func quoteID(id string) string {
	if len(id) > 64 {
		id = id[:64] + "…"
	}
	return fmt.Sprintf("%q", id)
}

// Config is the cluster's configuration, kept in etcd beside the members:
// the part of the key map that is not the member list.
type Config struct {
	// Replicas is R, how many servers keep each key.
	Replicas int `json:"replicas"`
}

// MaxReplicas bounds Config.Replicas.
const MaxReplicas = 16

// ParseConfig decodes the cluster's config record.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	if len(b) > maxRecordLen {
		return c, fmt.Errorf("%w: %d bytes", ErrBadConfig, len(b))
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if c.Replicas < 1 || c.Replicas > MaxReplicas {
		return Config{}, fmt.Errorf("%w: %d replicas (1 to %d)", ErrBadConfig, c.Replicas, MaxReplicas)
	}
	return c, nil
}
