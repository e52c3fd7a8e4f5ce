//go:build linux

package mem

import "testing"

// TestFindShared: a slice inside a shared region is found with its
// offset, one that runs past it or lies in other memory is not, a
// deregistered region is gone, and a lookup allocates nothing.
func TestFindShared(t *testing.T) {
	tbl := NewTable()
	var rs [3]*Region
	for i := range rs {
		r, err := tbl.RegisterShared(1, 64<<10, LocalWrite, Options{})
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
	}
	for i, r := range rs {
		b := r.Bytes()
		if s, off := FindShared(b[100:200]); s == nil || s != r.shared || off != 100 {
			t.Errorf("region %d: found %v at %d", i, s, off)
		}
		if s, _ := FindShared(b[len(b)-10:][:10:10]); s != r.shared {
			t.Errorf("region %d: its last bytes not found", i)
		}
	}
	if s, _ := FindShared(make([]byte, 100)); s != nil {
		t.Error("heap memory found shared")
	}
	if n := testing.AllocsPerRun(100, func() { FindShared(rs[1].Bytes()[5:50]) }); n != 0 {
		t.Errorf("FindShared allocates %v", n)
	}
	gone := rs[1].shared
	if err := rs[1].Deregister(); err != nil {
		t.Fatal(err)
	}
	if !gone.Dead() {
		t.Error("a deregistered segment is not dead")
	}
	for _, r := range []*Region{rs[0], rs[2]} {
		if s, _ := FindShared(r.Bytes()[:10]); s != r.shared {
			t.Error("a region still registered is not found after another went")
		}
		r.Deregister()
	}
}
