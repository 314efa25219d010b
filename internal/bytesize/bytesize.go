// Package bytesize reads and writes byte counts the way weir's settings
// and environment spell them: a whole number of bytes, optionally with a
// binary unit (KiB, MiB, GiB, TiB).
package bytesize

import (
	"errors"
	"strconv"
	"strings"
)

var units = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}

// Parse reads "1GiB", "256MiB", "512KiB" or "1048576" (bytes). The number
// is whole and not negative.
func Parse(s string) (int64, error) {
	num, shift := s, uint(0)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, shift = n, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("not a size (like 1GiB, 256MiB or a number of bytes)")
	}
	if n > (1<<63-1)>>shift {
		return 0, errors.New("size too large")
	}
	return n << shift, nil
}

// Format writes n in the largest unit that divides it: 1GiB, 300MiB, 1000.
func Format(n int64) string {
	for _, u := range units {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
