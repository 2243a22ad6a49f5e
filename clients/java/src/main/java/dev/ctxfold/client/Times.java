package dev.ctxfold.client;

import com.google.protobuf.Timestamp;
import java.time.Instant;

/** Between protobuf timestamps and {@link Instant}s. */
final class Times {
  private Times() {}

  static Instant of(Timestamp timestamp) {
    return Instant.ofEpochSecond(timestamp.getSeconds(), timestamp.getNanos());
  }

  static Timestamp toProto(Instant instant) {
    return Timestamp.newBuilder().setSeconds(instant.getEpochSecond()).setNanos(instant.getNano()).build();
  }
}
