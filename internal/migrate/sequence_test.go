package migrate

import (
	"strings"
	"testing"
)

// TestCheckSequence: migration versions run 1, 2, 3, … with no gap and no
// repeat, but for the retired numbers; the embedded ones do.
func TestCheckSequence(t *testing.T) {
	t.Parallel()
	retired := map[int]bool{3: true}
	for _, tc := range []struct {
		versions []int
		want     string
	}{
		{[]int{1, 2, 4, 5}, ""},
		{[]int{}, ""},
		{[]int{1, 2, 5}, "version 0004 is missing"},
		{[]int{2}, "version 0001 is missing"},
		{[]int{1, 2, 2, 4}, "version 0002 appears twice"},
		{[]int{1, 2, 3, 4}, "version 0003 appears twice"}, // a retired number used after all
	} {
		err := checkSequence(tc.versions, retired)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("checkSequence(%v) = %v, want %q", tc.versions, err, tc.want)
		}
	}
	if _, _, err := load(); err != nil {
		t.Errorf("the embedded migrations: %v", err)
	}
}
