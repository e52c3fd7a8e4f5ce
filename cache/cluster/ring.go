package cluster

import (
	"slices"
	"sort"

	"github.com/cespare/xxhash/v2"
)

// Ring is a member list frozen for routing: Owners gives a key's R
// servers by rendezvous hashing. Every process that builds a Ring from
// the same members and R gets the same owners for every key.
type Ring struct {
	members  []Member // sorted by ID
	hashes   []uint64 // xxhash of each member's ID
	replicas int
}

// NewRing makes a ring of members (in any order; an ID listed twice
// counts once) that keeps each key on replicas of them.
func NewRing(members []Member, replicas int) *Ring {
	ms := slices.Clone(members)
	sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	ms = slices.CompactFunc(ms, func(a, b Member) bool { return a.ID == b.ID })
	r := &Ring{members: ms, hashes: make([]uint64, len(ms)), replicas: max(1, replicas)}
	for i, m := range ms {
		r.hashes[i] = xxhash.Sum64String(m.ID)
	}
	return r
}

// Members returns the ring's members, sorted by ID.
func (r *Ring) Members() []Member { return slices.Clone(r.members) }

// Replicas returns R.
func (r *Ring) Replicas() int { return r.replicas }

// Len is the number of members.
func (r *Ring) Len() int { return len(r.members) }

// score is a member's weight for a key: a strong mix of the two hashes,
// so that each key ranks the members in an independent random order.
func score(key, member uint64) uint64 {
	// splitmix64's finalizer.
	z := key ^ member
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Owners appends to dst the members that own key, highest rank first:
// the first R of the members ranked for it (all of them if fewer).
func (r *Ring) Owners(dst []Member, key string) []Member {
	return r.Ranked(dst, key, r.replicas)
}

// Ranked appends to dst the first n members in key's order.
func (r *Ring) Ranked(dst []Member, key string, n int) []Member {
	n = min(n, len(r.members))
	if n <= 0 {
		return dst
	}
	hk := xxhash.Sum64String(key)
	// A small selection of the n best: n is R, a handful.
	var top [MaxReplicas]int
	var sc [MaxReplicas]uint64
	if n > MaxReplicas {
		n = MaxReplicas
	}
	k := 0
	for i, hm := range r.hashes {
		s := score(hk, hm)
		if k == n && s <= sc[k-1] {
			continue
		}
		j := min(k, n-1)
		for j > 0 && sc[j-1] < s {
			sc[j], top[j] = sc[j-1], top[j-1]
			j--
		}
		sc[j], top[j] = s, i
		if k < n {
			k++
		}
	}
	for _, i := range top[:k] {
		dst = append(dst, r.members[i])
	}
	return dst
}
