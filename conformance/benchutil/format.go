package benchutil

import (
	"cmp"
	"fmt"
	"slices"
)

// What the benchmarks' reports print alike.

// Spread is the median of xs with the lowest and highest (zeros for
// none): a figure over a benchmark's rounds.
func Spread[T cmp.Ordered](xs []T) (med, lo, hi T) {
	if len(xs) == 0 {
		return
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2], s[0], s[len(s)-1]
}

// Ratio prints a/b as "1.23×", or "–" when b is 0.
func Ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// Verdict prints whether a floor was met: PASS or FAIL.
func Verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// HumanBytes prints a byte count as whole GiB when it is one, else in
// MiB, or KiB below 1 MiB.
func HumanBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
