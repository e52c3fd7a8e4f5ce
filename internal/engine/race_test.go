//go:build race

package engine

// raceEnabled reports a test binary built with the race detector, whose
// tenfold cost the exhaustive tests scale down for.
const raceEnabled = true
