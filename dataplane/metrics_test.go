package dataplane

import (
	"testing"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestRequestOutcome: every way a request ends maps onto the fixed set.
func TestRequestOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		set    string
		status int
		last   weirv1.OutcomeClass
		want   string
	}{
		{"", 200, weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, outcomeSuccess},
		{"", 200, weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR, outcomeStreamError},
		{"", 429, weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, outcomeRateLimited},
		{"", 529, weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, outcomeOverloaded},
		{"", 502, weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, outcomeTransportError},
		{"", 400, weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR, outcomeClientError},
		{"", 500, weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR, outcomeUpstreamError},
		{"", 401, weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, outcomeAuthError},
		{"", 401, weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED, outcomeUnauthenticated},
		{"", 413, weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED, outcomeClientError},
		{"", 0, weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED, outcomeCanceled},
		{"", 200, weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED, outcomeCanceled},
		{outcomeUsageLimit, 429, weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, outcomeUsageLimit},
		{outcomeNoAccount, 529, weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED, outcomeNoAccount},
	} {
		got := requestOutcome(tc.set, tc.status, tc.last)
		if got != tc.want {
			t.Errorf("requestOutcome(%q, %d, %v) = %s, want %s", tc.set, tc.status, tc.last, got, tc.want)
		}
		found := false
		for _, o := range requestOutcomes {
			found = found || o == got
		}
		if !found {
			t.Errorf("%s is not in the fixed set", got)
		}
	}
}

// TestModelFamily: a model string becomes one of a few families.
func TestModelFamily(t *testing.T) {
	t.Parallel()
	for model, want := range map[string]string{
		"claude-sonnet-4-5-20250929": "sonnet",
		"claude-opus-4-1":            "opus",
		"claude-3-5-haiku-latest":    "haiku",
		"gpt-5-codex":                "codex",
		"gpt-4.1":                    "gpt",
		"o3-mini":                    "o-series",
		"my-alias":                   "other",
		"":                           "other",
	} {
		if got := modelFamily(model); got != want {
			t.Errorf("modelFamily(%q) = %s, want %s", model, got, want)
		}
	}
}
