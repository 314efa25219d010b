// Package quotamode names the quota response modes one way for everyone
// who reads or writes them: the settings table, the CLI and the dashboard.
package quotamode

import weirv1 "github.com/weirhq/weir/gen/weir/v1"

// byName are the modes by the names stored and typed.
var byName = map[string]weirv1.QuotaResponseMode{
	"retryable":   weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE,
	"usage_limit": weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT,
}

// Parse reads a mode's name; false for anything else.
func Parse(name string) (weirv1.QuotaResponseMode, bool) {
	m, ok := byName[name]
	return m, ok
}
