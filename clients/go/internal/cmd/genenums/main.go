// Command genenums writes ctxfold/enums_gen.go (see package enumgen). Run by `go generate ./ctxfold`.
package main

import (
	"log"
	"os"

	"github.com/ctxfold/ctxfold/clients/go/internal/enumgen"
)

func main() {
	src, err := enumgen.Generate()
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("enums_gen.go", src, 0o644); err != nil {
		log.Fatal(err)
	}
}
