package sysmon

import (
	"slices"
	"testing"
)

func TestEnv(t *testing.T) {
	steady := "GODEBUG=" + Setting
	for _, tc := range []struct {
		name    string
		environ []string
		want    []string // nil: run as it is
	}{
		{"no GODEBUG", []string{"HOME=/h", "PATH=/bin"}, []string{"HOME=/h", "PATH=/bin", steady}},
		{"an empty environment", nil, []string{steady}},
		{"other settings kept", []string{"GODEBUG=madvdontneed=1", "HOME=/h"}, []string{"GODEBUG=madvdontneed=1," + Setting, "HOME=/h"}},
		{"an empty GODEBUG", []string{"GODEBUG=", "HOME=/h"}, []string{steady, "HOME=/h"}},
		{"schedtrace=0 keeps the runtime's default", []string{"GODEBUG=schedtrace=0"}, nil},
		{"a schedtrace of the operator's", []string{"GODEBUG=gctrace=1, schedtrace=1000"}, nil},
		{"a variable that only ends in GODEBUG", []string{"MY_GODEBUG=x"}, []string{"MY_GODEBUG=x", steady}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Env(tc.environ); !slices.Equal(got, tc.want) {
				t.Errorf("Env(%q) = %q, want %q", tc.environ, got, tc.want)
			}
		})
	}
}
