"""The fleet: one plan (nodes, names, parameters) used by launch files and the fed-ros CLI; demo and
monitor."""
