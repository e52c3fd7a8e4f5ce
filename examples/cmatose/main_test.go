package main

import (
	"strings"
	"testing"
)

// TestCheckReceived: -check finds a message that is not the pattern, at
// either end of it (TestCmatose, in examples, runs -check end to end).
func TestCheckReceived(t *testing.T) {
	n := &node{id: 3, in: make([]byte, 5000)}
	for i := range n.in {
		n.in[i] = pattern(i)
	}
	if err := n.checkReceived(); err != nil {
		t.Fatalf("the pattern itself: %v", err)
	}
	for _, i := range []int{0, 4097, 4999} {
		n.in[i]++
		err := n.checkReceived()
		n.in[i]--
		if err == nil || !strings.Contains(err.Error(), "connection 3: byte") {
			t.Errorf("byte %d changed: %v, want it found", i, err)
		}
	}
}
