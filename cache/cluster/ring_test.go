package cluster_test

import (
	"fmt"
	"sort"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/gowarp/gowarp/cache/cluster"
)

func members(n int) []cluster.Member {
	var ms []cluster.Member
	for i := range n {
		ms = append(ms, cluster.Member{ID: fmt.Sprintf("s%d", i), Addr: fmt.Sprintf("127.0.0.1:%d", 7000+i)})
	}
	return ms
}

// refRanked is the plain statement of rendezvous hashing: sort all
// members by their score for the key.
func refRanked(ms []cluster.Member, key string, n int) []string {
	type sc struct {
		id string
		s  uint64
	}
	var all []sc
	hk := xxhash.Sum64String(key)
	for _, m := range ms {
		z := hk ^ xxhash.Sum64String(m.ID)
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		all = append(all, sc{m.ID, z ^ (z >> 31)})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].s > all[j].s })
	var out []string
	for _, a := range all[:min(n, len(all))] {
		out = append(out, a.id)
	}
	return out
}

func TestRingMatchesReference(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 20} {
		ms := members(n)
		r := cluster.NewRing(ms, 3)
		for _, want := range []int{1, 2, 3, 5, 16} {
			for k := range 200 {
				key := fmt.Sprintf("key-%d", k)
				var got []string
				for _, m := range r.Ranked(nil, key, want) {
					got = append(got, m.ID)
				}
				if ref := refRanked(ms, key, want); fmt.Sprint(got) != fmt.Sprint(ref) {
					t.Fatalf("%d members, %d ranked for %q: %v, want %v", n, want, key, got, ref)
				}
			}
		}
	}
}

// TestRingRemoveMovesOnlyItsKeys: taking a member out changes the owners
// of the keys it owned and of no other key; the keys spread evenly.
func TestRingRemoveMovesOnlyItsKeys(t *testing.T) {
	ms := members(5)
	full := cluster.NewRing(ms, 2)
	less := cluster.NewRing(append(append([]cluster.Member(nil), ms[:2]...), ms[3:]...), 2)
	count := map[string]int{}
	const keys = 5000
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		a, b := full.Owners(nil, key), less.Owners(nil, key)
		count[a[0].ID]++
		had := a[0].ID == "s2" || a[1].ID == "s2"
		if !had && fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%q: owners %v became %v though s2 owned none of it", key, ids(a), ids(b))
		}
		if had {
			// The survivor keeps its copy.
			other := a[0]
			if other.ID == "s2" {
				other = a[1]
			}
			if b[0].ID != other.ID && b[1].ID != other.ID {
				t.Fatalf("%q: owners %v became %v: the surviving owner lost it", key, ids(a), ids(b))
			}
		}
	}
	for id, n := range count {
		if n < keys/5*8/10 || n > keys/5*12/10 {
			t.Errorf("%s is first owner of %d of %d keys: uneven", id, n, keys)
		}
	}
}

func TestRingDuplicatesAndEmpty(t *testing.T) {
	if got := cluster.NewRing(nil, 2).Owners(nil, "k"); len(got) != 0 {
		t.Errorf("empty ring owners %v", got)
	}
	ms := members(2)
	r := cluster.NewRing(append(ms, ms...), 3)
	if r.Len() != 2 || len(r.Owners(nil, "k")) != 2 {
		t.Errorf("duplicated members: len %d, owners %v", r.Len(), r.Owners(nil, "k"))
	}
}

func BenchmarkRingOwners(b *testing.B) {
	r := cluster.NewRing(members(16), 2)
	dst := make([]cluster.Member, 0, 2)
	b.ReportAllocs()
	for b.Loop() {
		dst = r.Owners(dst[:0], "some-key-of-ordinary-length")
	}
}
