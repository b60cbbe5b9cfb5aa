# Ferry container image: `docker build -t ferry .`
# Runs `ferry serve --config /etc/ferry/ferry.yaml`; mount your configuration
# there (see docs/ferry.example.yaml) and publish the Kafka and admin ports.
#
#   docker run -v $PWD/ferry.yaml:/etc/ferry/ferry.yaml:ro -p 9092:9092 -p 9644:9644 ferry

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" -o /out/ferry ./cmd/ferry

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ferry /usr/local/bin/ferry
EXPOSE 9092 9644
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/ferry"]
CMD ["serve", "--config", "/etc/ferry/ferry.yaml"]
