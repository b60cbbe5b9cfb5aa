package admin

import (
	"embed"
	"io/fs"
	"net/http"
)

// uiFiles is the status page: index.html, app.js and style.css, built into
// the binary. The page loads nothing from elsewhere.
//
//go:embed ui/index.html ui/app.js ui/style.css
var uiFiles embed.FS

// uiCSP keeps the page to its own files: scripts, styles and fetches from
// the admin address only.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// handleUI serves the status page at / and its files under /ui/.
func (s *Server) handleUI() {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree always has ui/
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	uiHeaders := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Security-Policy", uiCSP)
			w.Header().Set("Cache-Control", "no-cache")
			h.ServeHTTP(w, r)
		})
	}
	s.mux.Handle("GET /ui/", uiHeaders(files))
	s.mux.Handle("GET /{$}", uiHeaders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, sub, "index.html")
	})))
}
