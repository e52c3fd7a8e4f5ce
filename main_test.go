package gowarp_test

import (
	"testing"

	"github.com/gowarp/gowarp/internal/testwatch"
)

// TestMain names the tests that hang, at the end of the log (see testwatch).
func TestMain(m *testing.M) { testwatch.Main(m) }
