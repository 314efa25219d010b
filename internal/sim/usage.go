package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"time"
)

// Every successful answer reports its tokens the way its wire does
// (Anthropic's cache_read_input_tokens and cache_creation_input_tokens,
// OpenAI's cached_tokens and reasoning_tokens), from one count made per
// request (exchange.usage) and a prompt cache modelled per account.

// Usage is what an answer reported it used, in one vocabulary across the
// wires (weir's TokenUsage): InputTokens is the input neither read from
// nor written to the prompt cache (on the OpenAI wires, their
// input_tokens or prompt_tokens less cached_tokens), so that all the
// input of a request is InputTokens + CacheReadTokens +
// CacheCreationTokens; OutputTokens includes ReasoningTokens.
type Usage struct {
	InputTokens         int `json:"input_tokens"`
	OutputTokens        int `json:"output_tokens"`
	CacheReadTokens     int `json:"cache_read_tokens,omitempty"`
	CacheCreationTokens int `json:"cache_creation_tokens,omitempty"`
	ReasoningTokens     int `json:"reasoning_tokens,omitempty"`
}

// cacheLifetime is how long a cached prompt prefix lasts after its last
// use, on the simulator's clock: the default lifetime of Anthropic's
// prompt cache (OpenAI keeps a prefix 5 to 10 minutes).
const cacheLifetime = 5 * time.Minute

// maxCachedPrefixes bounds the prefixes an account remembers: past it
// the expired ones are dropped, and if that is not enough, all of them.
const maxCachedPrefixes = 4096

// prefixKey names a prompt prefix: the model, the system prompt (or
// instructions), the tools and the conversation's first items.
type prefixKey [sha256.Size]byte

// The prompt cache: an account remembers the prefixes of the requests it
// served, each a request's model, system prompt, tools and every message
// (input item) but the last, for cacheLifetime since its last use. A
// request reads from the cache the longest of its own prefixes, cut at a
// message, that the account remembers (a retried request reads its whole
// prefix; the next turn of a conversation reads what the turn before
// wrote), and writes its whole prefix. On Messages only a request that
// asks for caching (a cache_control anywhere in its system, messages or
// tools; Claude Code always sends one) reads or writes, as the real API
// does; the OpenAI wires cache on their own.
//
// Tokens are counted by size, about four bytes a token: a request's
// input is its body's, a prefix's the bytes of its system prompt, tools
// and messages. What the request reads is CacheReadTokens; the rest of
// its prefix is CacheCreationTokens on Messages (OpenAI reports no
// writes: it is input there); what follows the prefix (the last message,
// and the body's other fields) is InputTokens.

// usage counts the request's tokens once, reading and writing the
// account's prompt cache on the way; later calls return the same count.
// Every successful answer, and every stream a fault cuts, makes the
// count before it answers, so that the cache follows the requests
// served whatever each answer reports.
func (x *exchange) usage() Usage {
	if x.counted != nil {
		return *x.counted
	}
	total := x.inputTokens()
	u := Usage{InputTokens: total, OutputTokens: x.outputTokens()}
	if x.wire != toolWireMessages {
		u.ReasoningTokens = x.reasoningTokens()
		u.OutputTokens += u.ReasoningTokens
	}
	if x.acct != nil && (x.wire != toolWireMessages || x.req.cacheControl) {
		sizes, keys := x.prefixes()
		if n := len(keys); n > 0 && sizes[n-1] > 0 {
			read := x.s.readPromptCache(x.acct, keys)
			prefix := min(approxTokensOf(sizes[n-1]), total)
			if read >= 0 {
				u.CacheReadTokens = min(approxTokensOf(sizes[read]), prefix)
			}
			if x.wire == toolWireMessages {
				u.CacheCreationTokens = prefix - u.CacheReadTokens
			}
			u.InputTokens = total - u.CacheReadTokens - u.CacheCreationTokens
		}
	}
	x.counted = &u
	return u
}

// approxTokensOf is a part's share of approxTokens: bytes/4, 0 for none.
func approxTokensOf(nbytes int) int { return nbytes / 4 }

// prefixes are the request's prefixes, one cut before each of its items:
// keys[k] names the model, system prompt, tools and first k items (never
// the last, k < len(items)), sizes[k] is that prefix's size in bytes (the
// model's excluded: it is no input).
func (x *exchange) prefixes() (sizes []int, keys []prefixKey) {
	items := x.req.items
	if len(items) == 0 {
		return nil, nil
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte(x.req.Model), x.req.system, x.req.tools} {
		h.Write(part) //nolint:errcheck // a hash never fails
		h.Write([]byte{0})
	}
	size := len(x.req.system) + len(x.req.tools)
	for k := range len(items) {
		var key prefixKey
		h.Sum(key[:0])
		sizes, keys = append(sizes, size), append(keys, key)
		h.Write(items[k]) //nolint:errcheck // a hash never fails
		h.Write([]byte{0})
		size += len(items[k])
	}
	return sizes, keys
}

// readPromptCache finds the longest of keys a remembers, -1 for none,
// and remembers it and the last key (the request's whole prefix) as used
// now.
func (s *Server) readPromptCache(a *account, keys []prefixKey) int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.promptCache == nil {
		a.promptCache = map[prefixKey]time.Time{}
	}
	read := -1
	for k := len(keys) - 1; k >= 0; k-- {
		if used, ok := a.promptCache[keys[k]]; ok && now.Sub(used) < cacheLifetime {
			read = k
			break
		}
	}
	if read >= 0 {
		a.promptCache[keys[read]] = now
	}
	if _, ok := a.promptCache[keys[len(keys)-1]]; !ok && len(a.promptCache) >= maxCachedPrefixes {
		for k, used := range a.promptCache {
			if now.Sub(used) >= cacheLifetime {
				delete(a.promptCache, k)
			}
		}
		if len(a.promptCache) >= maxCachedPrefixes {
			clear(a.promptCache)
		}
	}
	a.promptCache[keys[len(keys)-1]] = now
	return read
}

// hasCacheControl reports a "cache_control" key in raw JSON. A string
// value that holds the words has its quotes escaped, so only a key (or
// a string that is exactly the name, followed by a colon, which JSON
// does not allow outside a key) matches.
func hasCacheControl(raw json.RawMessage) bool {
	const key = `"cache_control"`
	for rest := []byte(raw); ; {
		i := bytes.Index(rest, []byte(key))
		if i < 0 {
			return false
		}
		rest = bytes.TrimLeft(rest[i+len(key):], " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' {
			return true
		}
	}
}

// Reasoning tokens by effort; a reasoning model asked for none gets the
// default (medium).
var reasoningByEffort = map[string]int{"none": 0, "minimal": 8, "low": 16, "medium": 64, "high": 256, "xhigh": 512}

// reasoningEffort reads the effort a Responses (reasoning.effort) or
// Chat Completions (reasoning_effort) request asks for: "" when it asks
// none, "medium" for a reasoning object without one.
func reasoningEffort(fields map[string]json.RawMessage) string {
	var effort string
	if json.Unmarshal(fields["reasoning_effort"], &effort) == nil && effort != "" {
		return effort
	}
	raw, ok := fields["reasoning"]
	if !ok || string(raw) == "null" {
		return ""
	}
	var r struct {
		Effort string `json:"effort"`
	}
	json.Unmarshal(raw, &r) //nolint:errcheck // an unreadable effort is the default
	if r.Effort == "" {
		return "medium"
	}
	return r.Effort
}

// reasoningTokens is the part of an OpenAI-wire answer's output spent
// reasoning: by the effort asked for, else the default for a reasoning
// model (gpt-5 and later, the codex models, the o-series), else none.
func (x *exchange) reasoningTokens() int {
	effort := x.req.reasoningEffort
	if effort == "" && reasoningModel(x.req.Model) {
		effort = "medium"
	}
	if effort == "" {
		return 0
	}
	if n, ok := reasoningByEffort[effort]; ok {
		return n
	}
	return reasoningByEffort["medium"]
}

// reasoningModel reports a model that reasons on its own.
func reasoningModel(model string) bool {
	m := strings.ToLower(model)
	switch {
	case strings.Contains(m, "codex"):
		return true
	case strings.HasPrefix(m, "gpt-") && len(m) > 4 && m[4] >= '5' && m[4] <= '9':
		return true
	}
	return len(m) >= 2 && m[0] == 'o' && m[1] >= '1' && m[1] <= '9'
}

// reportUsage logs u as what the attempt's answer has reported so far:
// the latest report stands (a stream's message_start, then its
// message_delta), so that a stream cut midway logs only what it
// delivered. It is called before the report is written.
func (x *exchange) reportUsage(u Usage) {
	t := trackOf(x.r.Context())
	if t == nil || !t.logged {
		return
	}
	x.s.attempts.update(t.gen, t.seq, func(a *Attempt) { a.Usage = u })
}

// The wires' usage objects.
type (
	// usage is Anthropic's (a message's, and message_start's).
	usage struct {
		InputTokens              int `json:"input_tokens"`
		CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int `json:"cache_read_input_tokens"`
		OutputTokens             int `json:"output_tokens"`
	}
	// responseUsage is the Responses API's.
	responseUsage struct {
		InputTokens         int                 `json:"input_tokens"`
		InputTokensDetails  inputTokensDetails  `json:"input_tokens_details"`
		OutputTokens        int                 `json:"output_tokens"`
		OutputTokensDetails outputTokensDetails `json:"output_tokens_details"`
		TotalTokens         int                 `json:"total_tokens"`
	}
	inputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	}
	outputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	}
	// chatUsage is Chat Completions'.
	chatUsage struct {
		PromptTokens            int                     `json:"prompt_tokens"`
		CompletionTokens        int                     `json:"completion_tokens"`
		TotalTokens             int                     `json:"total_tokens"`
		PromptTokensDetails     promptTokensDetails     `json:"prompt_tokens_details"`
		CompletionTokensDetails completionTokensDetails `json:"completion_tokens_details"`
	}
	promptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
		AudioTokens  int `json:"audio_tokens"`
	}
	completionTokensDetails struct {
		ReasoningTokens          int `json:"reasoning_tokens"`
		AudioTokens              int `json:"audio_tokens"`
		AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
		RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
	}
)

// anthropic is u as Anthropic reports it.
func (u Usage) anthropic() usage {
	return usage{InputTokens: u.InputTokens, CacheCreationInputTokens: u.CacheCreationTokens,
		CacheReadInputTokens: u.CacheReadTokens, OutputTokens: u.OutputTokens}
}

// openAIInput is the input as OpenAI counts it: cached tokens included.
func (u Usage) openAIInput() int { return u.InputTokens + u.CacheReadTokens + u.CacheCreationTokens }

// responses is u as the Responses API reports it.
func (u Usage) responses() *responseUsage {
	in := u.openAIInput()
	return &responseUsage{
		InputTokens: in, InputTokensDetails: inputTokensDetails{CachedTokens: u.CacheReadTokens},
		OutputTokens: u.OutputTokens, OutputTokensDetails: outputTokensDetails{ReasoningTokens: u.ReasoningTokens},
		TotalTokens: in + u.OutputTokens,
	}
}

// chat is u as Chat Completions reports it.
func (u Usage) chat() *chatUsage {
	in := u.openAIInput()
	return &chatUsage{
		PromptTokens: in, CompletionTokens: u.OutputTokens, TotalTokens: in + u.OutputTokens,
		PromptTokensDetails:     promptTokensDetails{CachedTokens: u.CacheReadTokens},
		CompletionTokensDetails: completionTokensDetails{ReasoningTokens: u.ReasoningTokens},
	}
}
