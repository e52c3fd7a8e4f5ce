package cluster_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/gowarp/gowarp/cache/cluster"
)

func TestMemberRecordRoundTrip(t *testing.T) {
	m := cluster.Member{ID: "cache-1", Addr: "10.0.0.1:7190", HTTP: "[::1]:7191", Started: time.Unix(1700000000, 0).UTC()}
	b, err := m.AppendRecord(nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cluster.ParseMember("cache-1", b)
	if err != nil || got != m {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, m)
	}
	if _, err := cluster.ParseMember("cache-2", b); !errors.Is(err, cluster.ErrBadMember) {
		t.Errorf("record under another ID: %v", err)
	}
}

func TestMemberValidate(t *testing.T) {
	for _, m := range []cluster.Member{
		{ID: "", Addr: "h:1"},
		{ID: "a b", Addr: "h:1"},
		{ID: "a/b", Addr: "h:1"},
		{ID: "é", Addr: "h:1"},
		{ID: string(bytes.Repeat([]byte("x"), cluster.MaxIDLen+1)), Addr: "h:1"},
		{ID: "a", Addr: "h"},
		{ID: "a", Addr: ":1"},
		{ID: "a", Addr: "h:"},
		{ID: "a", Addr: "h:1", HTTP: "nope"},
	} {
		if _, err := m.AppendRecord(nil); !errors.Is(err, cluster.ErrBadMember) {
			t.Errorf("%+v: %v, want ErrBadMember", m, err)
		}
	}
}

func TestParseConfig(t *testing.T) {
	for in, want := range map[string]int{`{"replicas":2}`: 2, `{"replicas":1,"x":true}`: 1} {
		if c, err := cluster.ParseConfig([]byte(in)); err != nil || c.Replicas != want {
			t.Errorf("%s: %+v, %v", in, c, err)
		}
	}
	for _, in := range []string{``, `{}`, `{"replicas":0}`, `{"replicas":17}`, `{"replicas":"2"}`, `[`} {
		if _, err := cluster.ParseConfig([]byte(in)); !errors.Is(err, cluster.ErrBadConfig) {
			t.Errorf("%q: %v, want ErrBadConfig", in, err)
		}
	}
}

// FuzzParseMember: any bytes under any ID give a member that re-encodes
// to the same member, or ErrBadMember; never a panic.
func FuzzParseMember(f *testing.F) {
	good, _ := cluster.Member{ID: "a", Addr: "127.0.0.1:7190", HTTP: "127.0.0.1:7191", Started: time.Unix(1, 0).UTC()}.AppendRecord(nil)
	f.Add("a", good)
	f.Add("a", []byte(`{"v":1,"id":"a","addr":"[::1]:1"}`))
	f.Add("a", []byte(`{"v":1,"id":"a","addr":"h:1","started":"not a time"}`))
	f.Add("x/y", []byte(`{"v":1,"id":"x/y","addr":"h:1"}`))
	f.Add("a", []byte(`{"v":2}`))
	f.Add("", []byte{})
	f.Add("a", []byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, id string, b []byte) {
		m, err := cluster.ParseMember(id, b)
		if err != nil {
			if !errors.Is(err, cluster.ErrBadMember) {
				t.Fatalf("error %v is not ErrBadMember", err)
			}
			return
		}
		if m.ID != id {
			t.Fatalf("parsed ID %q under key %q", m.ID, id)
		}
		b2, err := m.AppendRecord(nil)
		if err != nil {
			t.Fatalf("a parsed member does not encode: %v", err)
		}
		m2, err := cluster.ParseMember(id, b2)
		if err != nil || !m2.Started.Equal(m.Started) || m2.ID != m.ID || m2.Addr != m.Addr || m2.HTTP != m.HTTP {
			t.Fatalf("re-encoded %+v parses as %+v, %v", m, m2, err)
		}
	})
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"replicas":2}`))
	f.Add([]byte(`{"replicas":1e3}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := cluster.ParseConfig(b)
		if err != nil {
			if !errors.Is(err, cluster.ErrBadConfig) {
				t.Fatalf("error %v is not ErrBadConfig", err)
			}
			return
		}
		if c.Replicas < 1 || c.Replicas > cluster.MaxReplicas {
			t.Fatalf("accepted %d replicas", c.Replicas)
		}
	})
}
