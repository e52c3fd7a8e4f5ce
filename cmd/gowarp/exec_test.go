package main

import (
	"os"
	"testing"

	"github.com/gowarp/gowarp/internal/testwatch"
)

// TestMain runs the test binary as gowarp itself when GOWARP_CMD_MAIN is
// set: for commands that start gowarp as a process of its own (cache
// bench's server), which in a test is os.Executable, this binary.
func TestMain(m *testing.M) {
	if os.Getenv("GOWARP_CMD_MAIN") == "1" {
		main()
	}
	os.Exit(testwatch.Run(m))
}
