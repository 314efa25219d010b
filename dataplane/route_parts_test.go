package dataplane

import (
	"testing"
	"testing/synctest"
)

func TestPartsServedFirstTry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cp := newFakeCP(&fakeAccount{id: "a"})
		r := newRig(t, cp, nil)
		got := r.send(t.Context(), false)
		if got.status != 200 {
			t.Fatalf("status %d: %s", got.status, got.body)
		}
		t.Logf("at %v attempts %d", got.at, r.attempts())
	})
}
