"""The arm adapter's pure logic: arm profiles (a new arm is a profile), the safety filter, the tick
schedule and the arm-state store."""
