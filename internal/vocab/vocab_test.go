package vocab

import (
	"testing"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Names round-trip through Value, and a value this build does not know (a
// newer peer's) is named by its number instead of a panic.
func TestNameRoundTripAndUnknown(t *testing.T) {
	t.Parallel()
	for n := range weirv1.CooldownReason_name {
		r := weirv1.CooldownReason(n)
		if got := Value[weirv1.CooldownReason](Name(r)); got != r {
			t.Errorf("%v: Name %q parses back as %v", r, Name(r), got)
		}
	}
	if got := Name(weirv1.CooldownReason(987)); got != "987" {
		t.Errorf("unknown value named %q, want 987", got)
	}
	if got := Value[weirv1.CooldownReason]("987"); got != 0 {
		t.Errorf("an unknown name parses as %v, want the zero value", got)
	}
}
