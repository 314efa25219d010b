package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// maxTokenBody bounds a token endpoint's answer.
const maxTokenBody = 64 << 10

// Tokens is a token endpoint's answer to a refresh. Codex's has an
// id_token and no expires_in.
type Tokens struct {
	AccessToken string `json:"access_token"`
	// RefreshToken is "" when the endpoint did not rotate it.
	RefreshToken string `json:"refresh_token"`
	// ExpiresIn is the access token's lifetime in seconds; 0 when unsaid.
	ExpiresIn int64  `json:"expires_in"`
	IDToken   string `json:"id_token"`
}

// RefreshRejected is the token endpoint refusing the refresh token: it
// will not work again.
type RefreshRejected struct {
	// Code is the OAuth error code, else the HTTP status.
	Code string
}

func (e RefreshRejected) Error() string {
	return "refresh token rejected by the provider: " + e.Code
}

// refreshTokens POSTs body, a refresh of refresh, to tokenURL. Its errors
// never hold a token: RefreshRejected when the endpoint refused the
// refresh token (400 invalid_grant, invalid_client or
// unauthorized_client; 401; 403), anything else is transient.
func refreshTokens(ctx context.Context, client *http.Client, tokenURL string, body []byte, refresh string) (Tokens, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tokenURL, bytes.NewReader(body))
	if err != nil {
		return Tokens{}, fmt.Errorf("token request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return Tokens{}, fmt.Errorf("token endpoint unreachable: %w", Scrub(transportErr(err), refresh))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenBody))
	if resp.StatusCode != http.StatusOK {
		var oe struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(raw, &oe)
		code := oauthErrorCode(oe.Error)
		switch {
		case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
			if code == "" {
				code = strconv.Itoa(resp.StatusCode)
			}
			return Tokens{}, RefreshRejected{code}
		case resp.StatusCode == http.StatusBadRequest && (code == "invalid_grant" || code == "invalid_client" || code == "unauthorized_client"):
			return Tokens{}, RefreshRejected{code}
		case code != "":
			return Tokens{}, fmt.Errorf("token endpoint answered %d (%s)", resp.StatusCode, code)
		}
		return Tokens{}, fmt.Errorf("token endpoint answered %d", resp.StatusCode)
	}
	if err != nil {
		return Tokens{}, fmt.Errorf("token endpoint: read answer: %w", Scrub(err, refresh))
	}
	var tok Tokens
	if err := json.Unmarshal(raw, &tok); err != nil {
		return Tokens{}, errors.New("token endpoint: the answer is not a token JSON object")
	}
	if !TokenShaped(tok.AccessToken) || (tok.RefreshToken != "" && !TokenShaped(tok.RefreshToken)) {
		return Tokens{}, errors.New("token endpoint: the answer has no usable access_token")
	}
	return tok, nil
}

// oauthErrorCode keeps an OAuth error code when it looks like one (letters
// and underscores), so that nothing else from the answer reaches a log.
func oauthErrorCode(s string) string {
	if s == "" || len(s) > 64 {
		return ""
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && r != '_' {
			return ""
		}
	}
	return s
}
