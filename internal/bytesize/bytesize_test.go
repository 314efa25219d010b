package bytesize

import "testing"

func TestParseFormat(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		n    int64
		back string
	}{
		{"1GiB", 1 << 30, "1GiB"}, {"256MiB", 256 << 20, "256MiB"}, {"1536MiB", 1536 << 20, "1536MiB"},
		{"512KiB", 512 << 10, "512KiB"}, {"1000", 1000, "1000"}, {"0", 0, "0"}, {"2TiB", 2 << 40, "2TiB"},
	} {
		n, err := Parse(tt.in)
		if err != nil || n != tt.n || Format(n) != tt.back {
			t.Errorf("%s: %d %v, formats as %s", tt.in, n, err, Format(n))
		}
	}
	for _, bad := range []string{"", "1GB", "-1", "1.5GiB", "GiB", "99999999999TiB", " 1MiB"} {
		if n, err := Parse(bad); err == nil {
			t.Errorf("%q: %d, want an error", bad, n)
		}
	}
}
