// Package testwatch helps a hung test binary say where it hung. go test's
// -timeout panics with every goroutine's stack, the running tests named at
// the top; a CI log that keeps only its tail loses the names. Main dumps
// the stacks itself shortly before that timeout and ends with a summary of
// the goroutines running tests, so the tail of the log names them.
package testwatch

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// margin is how long before go test's -timeout the dump is taken.
const margin = 20 * time.Second

// Main runs the tests as a TestMain would, watching for a hang.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is m.Run watched for a hang, for a TestMain that does more.
func Run(m *testing.M) int {
	flag.Parse()
	stop := Start(timeout())
	defer stop()
	return m.Run()
}

// timeout is the binary's -test.timeout, or 0.
func timeout() time.Duration {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return 0
	}
	d, _ := time.ParseDuration(f.Value.String())
	return d
}

// Start arms the watch for a binary killed after d (0: never) and returns
// the function that disarms it.
func Start(d time.Duration) (stop func()) {
	if d <= 0 {
		return func() {}
	}
	at := d - margin
	if d < 4*margin {
		at = d * 9 / 10
	}
	t := time.AfterFunc(at, func() {
		Dump(os.Stderr, fmt.Sprintf("tests still running after %v (the timeout is %v)", at, d))
		os.Exit(2)
	})
	return func() { t.Stop() }
}

// Dump writes every goroutine's stack to w and then the summary: each
// goroutine with a test's function on its stack, its state, the function
// it is in and the test lines it came through.
func Dump(w io.Writer, why string) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	fmt.Fprintf(w, "testwatch: %s; all goroutines:\n\n", why)
	w.Write(buf)
	fmt.Fprintf(w, "\ntestwatch: %s; the goroutines in tests:\n", why)
	fmt.Fprint(w, Summary(buf))
}

// Summary picks, from runtime.Stack's text of all goroutines, those that
// run a test's code (a frame in a _test.go file), one line each for the
// header, the innermost function and every _test.go line.
func Summary(stacks []byte) string {
	var b strings.Builder
	for _, g := range bytes.Split(stacks, []byte("\n\n")) {
		lines := strings.Split(strings.TrimSpace(string(g)), "\n")
		if len(lines) < 3 || !strings.Contains(string(g), "_test.go:") {
			continue
		}
		fmt.Fprintf(&b, "%s\n  in %s\n", lines[0], lines[1])
		for i := 2; i < len(lines); i++ {
			l := strings.TrimSpace(lines[i])
			if strings.Contains(l, "_test.go:") {
				if i := strings.LastIndex(l, " +0x"); i > 0 {
					l = l[:i]
				}
				fmt.Fprintf(&b, "  %s (%s)\n", l, funcName(lines[i-1]))
			}
		}
	}
	return b.String()
}

// funcName is the function of a stack frame's first line, without its
// arguments and package path.
func funcName(l string) string {
	l = strings.TrimSpace(l)
	if i := strings.LastIndex(l, "("); i > 0 {
		l = l[:i]
	}
	if i := strings.LastIndex(l, "/"); i >= 0 {
		l = l[i+1:]
	}
	return l
}
