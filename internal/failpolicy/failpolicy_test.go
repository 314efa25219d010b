package failpolicy

import (
	"testing"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestDefault covers every outcome class the vocabulary has: a class added
// to types.proto without a row here fails.
func TestDefault(t *testing.T) {
	t.Parallel()
	want := map[weirv1.OutcomeClass]weirv1.Action{
		weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED:     weirv1.Action_ACTION_RESPOND,
		weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS:         weirv1.Action_ACTION_RESPOND,
		weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR:    weirv1.Action_ACTION_RESPOND,
		weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR:      weirv1.Action_ACTION_FAILOVER,
		weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:    weirv1.Action_ACTION_FAILOVER,
		weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:      weirv1.Action_ACTION_FAILOVER,
		weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR: weirv1.Action_ACTION_FAILOVER,
		weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR:    weirv1.Action_ACTION_RESPOND,
		weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED: weirv1.Action_ACTION_RESPOND,
		weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR:  weirv1.Action_ACTION_RESPOND,
		weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR:   weirv1.Action_ACTION_FAILOVER,
		weirv1.OutcomeClass_OUTCOME_CLASS_NOT_SENT:        weirv1.Action_ACTION_RESPOND,
	}
	values := weirv1.OutcomeClass(0).Descriptor().Values()
	for i := range values.Len() {
		c := weirv1.OutcomeClass(values.Get(i).Number())
		w, ok := want[c]
		if !ok {
			t.Errorf("%v: no row in this table; decide what it calls for", c)
			continue
		}
		if got := Default(c); got != w {
			t.Errorf("Default(%v) = %v, want %v", c, got, w)
		}
		if got := For(&weirv1.Outcome{Class: c, BytesToClient: true}); got != weirv1.Action_ACTION_RESPOND {
			t.Errorf("For(%v after output) = %v, want RESPOND", c, got)
		}
		if got := For(&weirv1.Outcome{Class: c}); got != w {
			t.Errorf("For(%v) = %v, want %v", c, got, w)
		}
	}
}
