package modelpattern

import "testing"

func TestValid(t *testing.T) {
	t.Parallel()
	for p, ok := range map[string]bool{
		"claude-sonnet-4-5": true, "claude-sonnet-*": true, "gpt-5*": true, "*": true,
		"": false, "claude-*-sonnet": false, "**": false, "gpt 5": false, "gpt-5?": false,
		"claude-[s]onnet": false, "a\x00b": false, string(make([]byte, 129)): false,
	} {
		if err := Valid(p); (err == nil) != ok {
			t.Errorf("Valid(%q) = %v, want ok %v", p, err, ok)
		}
	}
}

func TestMatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		patterns []string
		model    string
		want     bool
	}{
		{nil, "anything", true},
		{[]string{"claude-sonnet-*"}, "", true},
		{[]string{"claude-sonnet-*"}, "claude-sonnet-4-5", true},
		{[]string{"claude-sonnet-*"}, "claude-opus-4-1", false},
		{[]string{"claude-sonnet-*"}, "claude-sonnet-", true},
		{[]string{"gpt-5*"}, "gpt-5-codex", true},
		{[]string{"gpt-5"}, "gpt-5-codex", false},
		{[]string{"gpt-5"}, "gpt-5", true},
		{[]string{"x", "gpt-5*"}, "gpt-5", true},
		{[]string{"*"}, "o3", true},
	} {
		if got := Match(tc.patterns, tc.model); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.patterns, tc.model, got, tc.want)
		}
	}
}

func TestFamily(t *testing.T) {
	t.Parallel()
	for model, want := range map[string]string{
		"claude-sonnet-4-5-20250929": "sonnet", "claude-opus-4-1": "opus", "Claude-3-5-Haiku": "haiku",
		"claude-sonnet-*": "sonnet", "gpt-5-codex": "gpt-5-codex", "GPT-5": "gpt-5", "": "",
	} {
		if got := Family(model); got != want {
			t.Errorf("Family(%q) = %q, want %q", model, got, want)
		}
	}
}
