package quotamode

import (
	"testing"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]weirv1.QuotaResponseMode{
		"retryable":   weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE,
		"usage_limit": weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT,
	} {
		if got, ok := Parse(name); !ok || got != want {
			t.Errorf("Parse(%q) = %v %v", name, got, ok)
		}
	}
	for _, bad := range []string{"", "unspecified", "USAGE_LIMIT", "quota_response_mode_retryable"} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
