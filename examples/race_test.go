//go:build race

package examples_test

// Under the race detector the examples are built with it too, so that the
// two-process runs check them as well as this harness.
func init() { buildFlags = append(buildFlags, "-race") }
